"""NxD Training's DPO and ORPO example configs (vendored unchanged in configs/) run through the
YAML trainer on 2 gloo ranks, shrunk with overrides the way a user smoke-tests a config: DPO at
TP=2 and at DP=2 equals one process; preference accuracy rises; ORPO's loss falls; a run stopped
and resumed with precomputed reference log-probs continues exactly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

CONF = Path(__file__).parent / "configs"
DPO = str(CONF / "hf_llama3_8B_DPO_config.yaml")
ORPO = str(CONF / "hf_llama3_8B_ORPO_config.yaml")


def _run(source: str, args: list[str], log_dir: str) -> dict[str, Any]:
    from nxd_training.config import load_config
    from nxd_training.loop import train

    result = train(load_config(source, args), log_dir=log_dir)
    return {"losses": result.losses, "metrics": result.metrics, "start": result.start_step,
            "resumed": result.resumed_from}


def _late(values: dict[int, Any]) -> Any:
    """Mean over the last 3 steps (one step's 8 pairs are a noisy sample)."""
    steps = sorted(values)[-3:]
    if isinstance(values[steps[0]], dict):
        return {k: sum(values[s][k] for s in steps) / 3 for k in values[steps[0]]}
    return sum(values[s] for s in steps) / 3


def _rel(got: dict[int, float], ref: dict[int, float]) -> float:
    return max(abs(got[s] - ref[s]) / max(abs(ref[s]), 1e-12) for s in ref)


@pytest.fixture(scope="module")
def single(args_for, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("dpo1")
    args = args_for(DPO, out, devices=1, tp=1, extra=["distributed_strategy.sequence_parallel=false"])
    return _run(DPO, args, str(out / "run"))


@pytest.mark.slow
@pytest.mark.parametrize("tp", [2, 1], ids=["tp2", "dp2"])
def test_dpo_config_two_ranks_equals_one_process(tp: int, rank_pool, args_for, tmp_path: Path,
                                                 single: dict[str, Any]) -> None:
    args = args_for(DPO, tmp_path, devices=2, tp=tp,
                    extra=[] if tp == 2 else ["distributed_strategy.sequence_parallel=false"])
    results = rank_pool(2).run(_run, DPO, args, str(tmp_path / "run"))
    got, ref = results[0], single
    rel = _rel(got["losses"], ref["losses"])
    reward_rel = max(abs(got["metrics"][s]["rewards/chosen"] - ref["metrics"][s]["rewards/chosen"])
                     / max(abs(ref["metrics"][s]["rewards/chosen"]), 1e-3) for s in ref["metrics"])
    first, last = ref["metrics"][1], _late(ref["metrics"])
    print(f"DPO {'TP=2' if tp == 2 else 'DP=2'} vs one process: max rel loss diff {rel:.1e}, rewards/chosen "
          f"{reward_rel:.1e}; loss {ref['losses'][1]:.4f} -> {_late(ref['losses']):.4f}, accuracy "
          f"{first['rewards/accuracies']:.2f} -> {last['rewards/accuracies']:.2f} (mean of the last 3 steps), margin "
          f"{first['rewards/margins']:.3f} -> {last['rewards/margins']:.3f}")
    assert sorted(got["losses"]) == list(range(1, 13))
    assert rel <= 1e-5 and reward_rel <= 1e-4
    assert results[1]["losses"] == got["losses"]
    # the policy learns the preference: loss falls, chosen reward rises above rejected
    assert _late(ref["losses"]) < ref["losses"][1] - 0.05
    assert last["rewards/margins"] > 0.1 and last["rewards/accuracies"] >= 0.75



@pytest.mark.slow
def test_orpo_config_learns_on_two_ranks(rank_pool, args_for, tmp_path: Path) -> None:
    args = args_for(ORPO, tmp_path, devices=2, tp=2)
    results = rank_pool(2).run(_run, ORPO, args, str(tmp_path / "run"))
    losses, metrics = results[0]["losses"], results[0]["metrics"]
    first, last = metrics[1], _late(metrics)
    print(f"ORPO TP=2: loss {losses[1]:.4f} -> {_late(losses):.4f} (nll {first['nll_loss']:.3f} -> "
          f"{last['nll_loss']:.3f}), accuracy {first['rewards/accuracies']:.2f} -> {last['rewards/accuracies']:.2f}, "
          f"margin {first['rewards/margins']:.4f} -> {last['rewards/margins']:.4f}")
    assert results[1]["losses"] == losses
    assert _late(losses) < losses[1] - 0.5
    assert last["rewards/margins"] > first["rewards/margins"]


@pytest.mark.slow
def test_stop_and_resume_with_precomputed_reference_is_exact(rank_pool, args_for, tmp_path: Path) -> None:
    """Straight 6 steps vs 3 steps, stop, auto-resume to 6: the resumed run takes the reference
    log-probs from the checkpoint's data state (recomputing them from the trained policy would
    change every loss)."""
    six = ["trainer.max_steps=6", "model.optim.sched.max_steps=6"]
    pool = rank_pool(2)
    straight = pool.run(_run, DPO, args_for(DPO, tmp_path / "a", devices=2, tp=2, extra=six),
                        str(tmp_path / "a" / "run"))[0]
    pool.run(_run, DPO, args_for(DPO, tmp_path / "b", devices=2, tp=2, extra=[*six, "trainer.max_steps=3"]),
             str(tmp_path / "b" / "run"))
    resumed = pool.run(_run, DPO, args_for(DPO, tmp_path / "b", devices=2, tp=2, extra=six),
                       str(tmp_path / "b" / "run"))[0]
    assert resumed["start"] == 3 and resumed["resumed"]
    diffs = [abs(resumed["losses"][s] - straight["losses"][s]) for s in (4, 5, 6)]
    print(f"DPO stop at 3 / resume to 6 vs straight: loss diffs {diffs}")
    assert sorted(resumed["losses"]) == [4, 5, 6]
    assert diffs == [0.0, 0.0, 0.0]
    assert all(resumed["metrics"][s] == straight["metrics"][s] for s in (4, 5, 6))
