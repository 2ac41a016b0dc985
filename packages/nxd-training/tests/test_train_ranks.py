"""End-to-end YAML runs on 2 real gloo ranks: TP=2 and DP=2 learn, and stop + resume gives the
same losses as an uninterrupted run."""

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
            "valid": result.valid_losses, "resumed": result.resumed_from}


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["tp2", "dp2"])
def test_two_rank_run_learns(rank_pool, make_config, tmp_path: Path, layout: str) -> None:
    tp = 2 if layout == "tp2" else 1
    config = make_config(
        trainer={"max_steps": 12, "val_check_interval": 6},
        distributed_strategy={"tensor_model_parallel_size": tp},
        exp_manager={"checkpoint_callback_params": {"every_n_train_steps": 6}},
    )
    log_dir = tmp_path / layout
    results = rank_pool(2).run(_train, config, str(log_dir))
    losses = results[0]["losses"]
    assert sorted(losses) == list(range(1, 13))
    # every rank reports the same global loss (TP: same loss; DP: all-reduced mean)
    assert results[0]["losses"] == results[1]["losses"]
    first, last = sum(losses[s] for s in (1, 2)) / 2, sum(losses[s] for s in (11, 12)) / 2
    assert last < first - 0.5, f"loss did not fall: {first:.3f} -> {last:.3f}"
    assert set(results[0]["valid"]) == {6, 12}
    # the experiment manager's outputs
    records = read_metrics(log_dir)
    assert [r["step"] for r in records] == list(range(1, 13))
    assert all(abs(r["loss"] - losses[r["step"]]) < 1e-9 for r in records)
    for key in ("lr", "grad_norm", "tokens_per_s", "peak_memory_mb", "consumed_samples"):
        assert key in records[-1], key
    assert records[-1]["consumed_samples"] == 12 * 4
    assert list(log_dir.glob("events.out.tfevents.*")), "no TensorBoard event file"
    tags = sorted(p.name for p in (log_dir / "checkpoints").iterdir() if (p / "done").exists())
    assert tags == ["tiny--step=12-consumed_samples=48", "tiny--step=6-consumed_samples=24"]


@pytest.mark.slow
def test_stop_and_resume_matches_uninterrupted(rank_pool, make_config, tmp_path: Path) -> None:
    common = {"model": {"optim": {"sched": {"name": "cosine", "warmup_steps": 2, "max_steps": 8, "min_lr": 1e-3}}},
              "distributed_strategy": {"tensor_model_parallel_size": 1},  # DP=2: data position matters per rank
              "exp_manager": {"resume_if_exists": True, "checkpoint_callback_params": {"every_n_train_steps": 4}}}
    pool = rank_pool(2)
    full = pool.run(_train, make_config(trainer={"max_steps": 8}, **common), str(tmp_path / "full"))[0]
    part = pool.run(_train, make_config(trainer={"max_steps": 4}, **common), str(tmp_path / "split"))[0]
    rest = pool.run(_train, make_config(trainer={"max_steps": 8}, **common), str(tmp_path / "split"))[0]
    assert part["final"] == 4 and rest["start"] == 4 and rest["resumed"] is not None
    assert sorted(rest["losses"]) == [5, 6, 7, 8]
    diffs = [abs(rest["losses"][s] - full["losses"][s]) for s in range(5, 9)]
    assert max(diffs) == 0.0, f"resumed losses differ from the uninterrupted run: {diffs}"
    assert [part["losses"][s] for s in range(1, 5)] == [full["losses"][s] for s in range(1, 5)]
    # the metrics file of the resumed run holds one record per step
    assert [r["step"] for r in read_metrics(tmp_path / "split")] == list(range(1, 9))


@pytest.mark.parametrize("zero1", [False, True], ids=["plain", "zero1"])
def test_dp2_grad_accumulation_matches_one_process(rank_pool, make_config, tmp_path: Path, zero1: bool) -> None:
    # global batch 8 = micro-batch 2 x DP 2 x 2 accumulation steps (the first under model.no_sync())
    # against one process running the same 8 samples as 4 micro-batches
    common = {"trainer": {"max_steps": 4}, "data": {"global_batch_size": 8},
              "exp_manager": {"create_checkpoint_callback": False}}
    dp2 = make_config(distributed_strategy={"tensor_model_parallel_size": 1, "zero1": zero1}, **common)
    one = make_config(distributed_strategy={"tensor_model_parallel_size": 1}, **common)
    one["trainer"]["devices"] = 1
    got = rank_pool(2).run(_train, dp2, str(tmp_path / "dp2"))
    ref = _train(one, str(tmp_path / "one"))["losses"]
    assert sorted(got[0]["losses"]) == sorted(ref) == [1, 2, 3, 4]
    assert got[0]["losses"] == got[1]["losses"]
    rel = max(abs(got[0]["losses"][s] - ref[s]) / abs(ref[s]) for s in ref)
    print(f"DP=2 x accumulation 2 ({'zero1' if zero1 else 'plain'}) vs one process: max relative loss diff {rel:.2e}")
    assert rel < 1e-5, (got[0]["losses"], ref)
    assert ref[4] < ref[1] - 0.3  # the runs being compared learn


@pytest.mark.parametrize("granularity", ["full", "op"])
def test_activation_checkpointing_yaml_run_matches_none(make_config, tmp_path: Path, granularity: str) -> None:
    # recomputation reruns the same fp32 ops on the same inputs: the losses must not move
    common = {"trainer": {"max_steps": 3, "devices": 1}, "exp_manager": {"create_checkpoint_callback": False},
              "distributed_strategy": {"tensor_model_parallel_size": 1}}
    plain = _train(make_config(**common), str(tmp_path / "plain"))["losses"]
    ckpt = _train(make_config(model={"activations_checkpoint_granularity": granularity}, **common),
                  str(tmp_path / granularity))["losses"]
    assert sorted(ckpt) == [1, 2, 3]
    rel = max(abs(ckpt[s] - plain[s]) / abs(plain[s]) for s in plain)
    assert rel < 1e-6, (granularity, ckpt, plain)
