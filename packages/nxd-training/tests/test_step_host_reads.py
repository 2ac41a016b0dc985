"""A training step reads nothing back from the device (issue 35): the loss, grad norm and metrics
come back one step late through nxd_training.readback.StepReadback, read by the loop after the next
step is launched. On the CPU this is checked by construction: every read of a tensor's value to the
host (``aten._local_scalar_dense``: ``.item()``, ``float()``, ``bool()``; ``.tolist()``; ``.numpy()``)
inside ``Trainer.train_step`` is counted, except the optimizer's step counters (CPU tensors on every
device, read by torch.optim on the host). The readback itself is replaced by one that reads only
when the loop asks, as on CUDA."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from torch.utils._python_dispatch import TorchDispatchMode

from nxd.cli import main
from nxd_training import loop
from nxd_training.exp_manager import read_metrics


class _Deferred(loop.StepReadback):
    """CUDA's behaviour on the CPU: the values are read when the loop asks, not in the step."""

    def __init__(self, values: dict[str, torch.Tensor]) -> None:
        self._tensors = {k: v.detach().float().reshape(()).clone() for k, v in values.items()}
        self.ready_s = None

    def values(self) -> dict[str, float]:
        import time

        self.ready_s = time.perf_counter()
        return {k: float(v) for k, v in self._tensors.items()}


class _HostReads(TorchDispatchMode):
    def __init__(self, optimizer) -> None:
        super().__init__()
        self.optimizer, self.reads = optimizer, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        # the optimizer's step counters are made in its first step: looked up at each read
        if (func is torch.ops.aten._local_scalar_dense.default
                and id(args[0]) not in _step_counters(self.optimizer)):
            import traceback

            self.reads.append("".join(traceback.format_stack(limit=8)[:-1]))
        return func(*args, **(kwargs or {}))


def _step_counters(optimizer) -> set[int]:
    seen, out = set(), set()
    stack = [optimizer]
    while stack:
        opt = stack.pop()
        if id(opt) in seen or opt is None:
            continue
        seen.add(id(opt))
        for state in getattr(opt, "state", {}).values():
            if isinstance(state, dict) and torch.is_tensor(state.get("step")):
                out.add(id(state["step"]))
        stack += [getattr(opt, name, None) for name in ("optimizer", "optim")]
    return out


@pytest.mark.launch
@pytest.mark.parametrize("zero1", [False, True])
def test_a_step_reads_nothing_back(make_config, tmp_path: Path, monkeypatch, zero1: bool) -> None:
    reads: list[list[str]] = []
    step = loop.Trainer.train_step

    def counted(self, it):
        mode = _HostReads(self.optimizer)
        tolist, numpy = torch.Tensor.tolist, torch.Tensor.numpy
        with mode:
            monkeypatch.setattr(torch.Tensor, "tolist", lambda t: mode.reads.append("tolist") or tolist(t))
            monkeypatch.setattr(torch.Tensor, "numpy", lambda t, **k: mode.reads.append("numpy") or numpy(t, **k))
            try:
                out = step(self, it)
            finally:
                monkeypatch.setattr(torch.Tensor, "tolist", tolist)
                monkeypatch.setattr(torch.Tensor, "numpy", numpy)
        reads.append(mode.reads)
        return out

    monkeypatch.setattr(loop, "StepReadback", _Deferred)
    monkeypatch.setattr(loop.Trainer, "train_step", counted)
    config = make_config(trainer={"devices": 1, "max_steps": 3, "gradient_clip_val": 1.0},
                         distributed_strategy={"tensor_model_parallel_size": 1, "zero1": zero1},
                         exp_manager={"create_checkpoint_callback": False, "log_gradient_norm": True})
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["train", str(path), "exp_manager.name=reads"]) == 0
    assert reads == [[], [], []], reads[0][:3]
    rows = read_metrics(Path(config["exp_manager"]["exp_dir"]) / "reads" / "version_0")
    assert [r["step"] for r in rows] == [1, 2, 3] and all("grad_norm" in r and "loss" in r for r in rows)
