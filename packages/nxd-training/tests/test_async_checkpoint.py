"""`exp_manager.async_checkpointing: true`: the save overlaps its snapshot copy with the next step, and
still writes exactly what a synchronous save of the same step writes; the loop's stall per save
(the call plus the next step's wait for the copy) is logged."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch


def _tensors(ckpt: Path) -> dict[str, torch.Tensor]:
    out = {}
    for f in sorted(ckpt.rglob("*.pt")):
        if f.parent.name in ("model", "optim"):
            state = torch.load(f, map_location="cpu", weights_only=False)
            stack = [(f"{f.parent.name}/{f.name}", state)]
            while stack:
                key, value = stack.pop()
                if isinstance(value, dict):
                    stack.extend((f"{key}.{k}", v) for k, v in value.items())
                elif isinstance(value, torch.Tensor):
                    out[key] = value
    return out


@pytest.mark.slow
def test_async_save_writes_what_a_sync_save_writes(make_config, tmp_path: Path) -> None:
    from nxd_training.config import load_config
    from nxd_training.exp_manager import read_metrics
    from nxd_training.loop import train

    runs = {}
    for mode in ("sync", "async"):
        log_dir = tmp_path / mode
        runs[mode] = train(load_config(make_config(
            trainer={"devices": 1, "max_steps": 3}, distributed_strategy={"tensor_model_parallel_size": 1},
            exp_manager={"explicit_log_dir": str(log_dir), "async_checkpointing": mode == "async",
                         "checkpoint_callback_params": {"every_n_train_steps": 2, "save_top_k": 2}})))
    tag = "tiny--step=2-consumed_samples=8"
    sync, overlapped = (_tensors(Path(runs[m].log_dir) / "checkpoints" / tag) for m in ("sync", "async"))
    assert sync and sorted(sync) == sorted(overlapped)
    assert any(k.startswith("optim/") for k in sync)
    for key, value in sync.items():
        assert torch.equal(value, overlapped[key]), key  # step 3's update never reached the step-2 snapshot
    records = {r["step"]: r for r in read_metrics(runs["async"].log_dir, split="checkpoint")}
    assert records[2]["async"] == 1 and records[2]["snapshot_wait_s"] >= 0
    assert records[2]["blocked_s"] == pytest.approx(records[2]["call_s"] + records[2]["snapshot_wait_s"])
