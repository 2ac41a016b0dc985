"""ZeRO-1 through the YAML (``distributed_strategy.zero1``) on 2 real gloo ranks at DP=2: fp32 losses
equal plain data parallelism, the bf16 precision modes train, and stop + resume is exact."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nxd_training.exp_manager import read_metrics


def _train(config: dict[str, Any], log_dir: str) -> dict[str, Any]:
    from nxd_training.config import load_config
    from nxd_training.loop import train

    result = train(load_config(config), log_dir=log_dir)
    return {"losses": result.losses, "start": result.start_step, "final": result.final_step,
            "resumed": result.resumed_from}


def _dp2(make_config, zero1: bool, **sections: Any) -> dict[str, Any]:
    return make_config(distributed_strategy={"tensor_model_parallel_size": 1, "zero1": zero1},
                       exp_manager={"create_checkpoint_callback": False}, **sections)


def test_zero1_fp32_matches_plain_dp(rank_pool, make_config, tmp_path: Path) -> None:
    pool = rank_pool(2)
    plain = pool.run(_train, _dp2(make_config, False), str(tmp_path / "plain"))
    zero1 = pool.run(_train, _dp2(make_config, True), str(tmp_path / "zero1"))
    ref, got = plain[0]["losses"], zero1[0]["losses"]
    assert sorted(got) == sorted(ref) == list(range(1, 7))
    rel = max(abs(got[s] - ref[s]) / abs(ref[s]) for s in ref)
    print(f"zero1 vs plain DP=2 fp32: max relative loss diff {rel:.2e}")
    assert rel < 1e-5, rel
    assert zero1[0]["losses"] == zero1[1]["losses"]
    assert ref[6] < ref[1] - 0.3  # the comparison is between runs that learn
    # the pre-clip gradient norm (sharded norm vs all-reduced grads) agrees as well
    norms = [(r["grad_norm"], z["grad_norm"]) for r, z in zip(read_metrics(tmp_path / "plain"),
                                                              read_metrics(tmp_path / "zero1"))]
    assert len(norms) == 6
    assert max(abs(a - b) / a for a, b in norms) < 1e-5, norms


@pytest.mark.slow
@pytest.mark.parametrize("precision", [
    {"type": "mixed_precision"},                       # bf16 params, fp32 master weights + fp32 grad acc
    {"type": "mixed_precisionSR"},                     # ... and stochastic rounding of the master into bf16
    {"type": "bf16SR"},                                # bf16 params are the truth, updates rounded stochastically
])
def test_zero1_bf16_modes_train(rank_pool, make_config, tmp_path: Path, precision: dict[str, Any]) -> None:
    config = _dp2(make_config, True, precision=precision, trainer={"max_steps": 8})
    results = rank_pool(2).run(_train, config, str(tmp_path / "run"))
    losses = results[0]["losses"]
    assert sorted(losses) == list(range(1, 9))
    assert all(v == v for v in losses.values()), losses  # no NaN
    first, last = (losses[1] + losses[2]) / 2, (losses[7] + losses[8]) / 2
    print(f"zero1 {precision['type']}: loss {first:.3f} -> {last:.3f}")
    assert last < first - 0.3, f"{precision['type']}: loss did not fall: {first:.3f} -> {last:.3f}"
    assert results[0]["losses"] == results[1]["losses"]


@pytest.mark.slow
@pytest.mark.parametrize("precision", [
    {"type": "fp32"},
    {"type": "mixed_precisionSR"},   # the fp32 master and the SR generator must come back too
])
def test_zero1_resume_matches_uninterrupted(rank_pool, make_config, tmp_path: Path, precision: dict) -> None:
    em = {"resume_if_exists": True, "checkpoint_callback_params": {"every_n_train_steps": 3,
                                                                   "use_master_weights_in_ckpt": True}}
    common = {"distributed_strategy": {"tensor_model_parallel_size": 1, "zero1": True}, "exp_manager": em,
              "precision": precision}
    pool = rank_pool(2)
    full = pool.run(_train, make_config(trainer={"max_steps": 6}, **common), str(tmp_path / "full"))[0]
    part = pool.run(_train, make_config(trainer={"max_steps": 3}, **common), str(tmp_path / "split"))[0]
    rest = pool.run(_train, make_config(trainer={"max_steps": 6}, **common), str(tmp_path / "split"))[0]
    assert part["final"] == 3 and rest["start"] == 3 and rest["resumed"] is not None
    assert sorted(rest["losses"]) == [4, 5, 6]
    assert [rest["losses"][s] for s in (4, 5, 6)] == [full["losses"][s] for s in (4, 5, 6)], (rest, full)
    # the optimizer was saved as one shard per DP rank (ZeRO-1), not once from DP rank 0
    tag = next(p for p in (tmp_path / "split" / "checkpoints").iterdir() if "step=3" in p.name)
    shards = sorted(p.name for p in tag.rglob("*") if p.is_file() and "optim" in p.parent.name)
    assert [n.startswith(("dp_rank_00", "dp_rank_01")) for n in shards] == [True, True], shards
