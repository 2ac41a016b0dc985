"""DP gradient all-reduce overlapped with backward (NxDOptimizer + NxDModel.no_sync) on 2 gloo
ranks, against one process training the same model on the whole batch with plain torch."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.distributed as dist
from torch import nn

from nxd_core_parallel import parallel_state as ps
from nxd_core_parallel.trainer import NxDModel, NxDOptimizer
from nxd_testing.reference import max_rel, train_reference

HID, BATCH, STEPS, MICRO, LR, MAX_NORM = 8, 8, 5, 2, 0.05, 0.5
TOL = 1e-5


class Net(nn.Module):
    """Three layers; the last holds a parameter the forward never uses, so the bucket it shares
    with that layer's weight and bias never fills and they take the after-backward path."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(HID, 2 * HID), nn.Linear(2 * HID, 2 * HID), nn.Linear(2 * HID, 1)
        self.c.unused = nn.Parameter(torch.ones(3))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return (self.c(torch.tanh(self.b(torch.tanh(self.a(x))))).squeeze(-1) - y).square().mean()


def build() -> Net:
    torch.manual_seed(7)
    return Net()


def data(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(50 + step)
    x = torch.randn(BATCH, HID, generator=g)
    return x, x.sum(-1).sin() + 0.1 * torch.randn(BATCH, generator=g)


def reference() -> list[float]:
    model = build()
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    return train_reference(model, opt, (data(step) for step in range(STEPS)), max_norm=MAX_NORM).losses


def overlap_body(overlap: bool, use_no_sync: bool) -> dict:
    """Each rank takes half the batch in MICRO micro-batches; loss per micro-batch / MICRO."""
    ps.initialize_model_parallel(1)
    cfg = {"optimizer_config": {"grad_clipping": True, "max_grad_norm": MAX_NORM}, "sequence_parallel": False}
    model = NxDModel(build(), cfg)
    # A 64-byte cap: buckets [c.unused, c.bias, c.weight], [b.bias], [b.weight], [a.bias], [a.weight].
    opt = NxDOptimizer(torch.optim.AdamW(model.parameters(), lr=LR), cfg, overlap_grad_sync=overlap,
                       bucket_cap_bytes=64)
    rank, per_rank = dist.get_rank(), BATCH // 2
    losses, synced_after_backward, local_after_no_sync = [], [], []
    for step in range(STEPS):
        x, y = data(step)
        x, y = x[rank * per_rank:(rank + 1) * per_rank], y[rank * per_rank:(rank + 1) * per_rank]
        total = torch.zeros(())
        for m, (xm, ym) in enumerate(zip(x.chunk(MICRO), y.chunk(MICRO))):
            last = m == MICRO - 1
            with model.no_sync() if use_no_sync and not last else contextlib.nullcontext():
                loss = model(xm, ym)
                (loss / MICRO).backward()
            total += loss.detach() / MICRO
            same = {}
            for name in ("b", "c"):
                grad = getattr(model, name).weight.grad
                grads = [torch.empty_like(grad) for _ in range(2)]
                dist.all_gather(grads, grad)
                same[name] = torch.equal(*grads)
            if use_no_sync and not last:
                local_after_no_sync.append(not same["b"])
            elif last:
                synced_after_backward.append((same["b"], same["c"]))
        opt.step()
        opt.zero_grad()
        dist.all_reduce(total)
        losses.append(float(total) / 2)
    return {"losses": losses, "synced_after_backward": synced_after_backward,
            "local_after_no_sync": local_after_no_sync, "overlap": opt.overlap_grad_sync,
            "buckets": len(opt._reducer.buckets) if opt._reducer else 0}


@pytest.fixture(scope="module")
def ref_losses() -> list[float]:
    return reference()


@pytest.mark.parametrize("overlap,use_no_sync", [(True, True), (True, False), (False, True)],
                         ids=["overlap-no_sync", "overlap-sync-every-micro", "after-backward"])
def test_dp2_grad_accumulation_matches_single_process(rank_pool, ref_losses, overlap, use_no_sync):
    for out in rank_pool(2).run(overlap_body, overlap, use_no_sync):
        worst = max_rel(out["losses"], ref_losses)
        print(f"overlap={overlap} no_sync={use_no_sync}: max loss rel diff {worst:.2e}")
        assert worst < TOL
        assert out["overlap"] is overlap
        if overlap:
            assert out["buckets"] >= 4
            # The hooks averaged b's gradient during backward, before step() ran; c's bucket
            # (with the unused parameter) never filled, so step() averaged it afterwards.
            assert out["synced_after_backward"] == [(True, False)] * STEPS
        else:
            assert out["synced_after_backward"] == [(False, False)] * STEPS
        if use_no_sync:
            # Under no_sync the ranks kept their own (different) partial gradients.
            assert all(out["local_after_no_sync"]) and len(out["local_after_no_sync"]) == STEPS * (MICRO - 1)


def test_overlap_needs_data_parallelism():
    # No process groups here: asking for overlap is a clear error, the default quietly skips it.
    model = nn.Linear(2, 2)
    with pytest.raises(ValueError, match="data_parallel_size > 1"):
        NxDOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), {}, overlap_grad_sync=True)
    assert NxDOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), {}).overlap_grad_sync is False


def same_grads_body() -> bool:
    """Gradients averaged by the hooks equal, bit for bit, those of the after-backward path."""
    ps.initialize_model_parallel(1)
    x, y = data(0)
    x, y = x[dist.get_rank()::2], y[dist.get_rank()::2]
    grads = []
    for overlap in (True, False):
        model = build()
        opt = NxDOptimizer(torch.optim.SGD(model.parameters(), lr=LR), {}, overlap_grad_sync=overlap,
                           bucket_cap_bytes=64)
        model(x, y).backward()
        opt.sync_gradients()
        grads.append([p.grad for p in model.parameters() if p.grad is not None])
    return len(grads[0]) == 6 and all(torch.equal(a, b) for a, b in zip(*grads))


def test_overlap_grads_bitwise_equal_after_backward_path(rank_pool):
    assert rank_pool(2).run(same_grads_body) == [True, True]
