"""Data-parallel gradient all-reduce overlapped with backward.

Each parameter's post-accumulate-grad hook copies its gradient into a flat bucket; buckets are
filled in reverse parameter order (roughly the order backward produces gradients) and a bucket's
asynchronous all-reduce starts as soon as all its parameters are ready, while backward keeps
computing earlier layers. At the end of the backward pass (an autograd engine callback) the
reductions are waited for, divided by the DP size and copied back into ``.grad``: waiting there
rather than later keeps gradient accumulation across several backward passes correct, because the
next pass must accumulate into the averaged gradients, not under a pending reduction.

Parameters whose hook did not fire, or whose bucket never filled (unused parameters, gradients set
by hand), are reported by :meth:`OverlappedGradReducer.unreduced`; ``NxDOptimizer.step`` averages
them with the after-backward bucketed path, so every gradient is averaged exactly once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

#: Like DistributedDataParallel: a small first bucket so communication starts early in backward.
FIRST_BUCKET_CAP_BYTES = 1024 * 1024
OVERLAP_BUCKET_CAP_BYTES = 25 * 1024 * 1024

_no_sync_depth = 0


@contextlib.contextmanager
def no_sync() -> Iterator[None]:
    """Backward passes run inside skip the overlapped DP all-reduce: gradients just accumulate
    locally (for all but the last micro-batch of a gradient-accumulation step). The next synced
    backward, or ``NxDOptimizer.step``, averages the accumulated sum."""
    global _no_sync_depth
    _no_sync_depth += 1
    try:
        yield
    finally:
        _no_sync_depth -= 1


def grad_sync_enabled() -> bool:
    """False inside :func:`no_sync`."""
    return _no_sync_depth == 0


class _Bucket:
    def __init__(self, params: list[torch.Tensor]) -> None:
        self.params = params
        self.offsets: dict[int, int] = {}
        offset = 0
        for p in params:
            self.offsets[id(p)] = offset
            offset += p.numel()
        self.flat = torch.empty(offset, dtype=params[0].dtype, device=params[0].device)
        self.ready: set[int] = set()
        self.work: Any = None


class OverlappedGradReducer:
    """Averages ``params``' gradients over ``group`` during backward (see the module docstring).
    ``params`` should be in model order; buckets are built from the last one backwards."""

    def __init__(self, params: list[torch.Tensor], group: Any, bucket_cap_bytes: int = OVERLAP_BUCKET_CAP_BYTES,
                 first_bucket_cap_bytes: int = FIRST_BUCKET_CAP_BYTES) -> None:
        self.group = group
        self.world = dist.get_world_size(group)
        self.buckets = self._make_buckets([p for p in params if p.requires_grad], bucket_cap_bytes,
                                          first_bucket_cap_bytes)
        self._bucket_of = {id(p): b for b in self.buckets for p in b.params}
        self._reduced: set[int] = set()  # params whose current .grad is already the DP average
        self._pass_task: int | None = None  # graph task of the backward whose end callback is queued
        self._handles = [p.register_post_accumulate_grad_hook(self._on_grad_ready) for b in self.buckets for p in b.params]

    @staticmethod
    def _make_buckets(params: list[torch.Tensor], cap: int, first_cap: int) -> list[_Bucket]:
        # As DistributedDataParallel: a bucket closes once it reaches its cap (so it may exceed it).
        buckets: list[_Bucket] = []
        open_: dict[tuple, tuple[list[torch.Tensor], int]] = {}
        for p in reversed(params):
            key = (p.dtype, p.device)
            members, size = open_.get(key, ([], 0))
            members, size = members + [p], size + p.numel() * p.element_size()
            if size >= (first_cap if not buckets else cap):
                buckets.append(_Bucket(members))
                members, size = [], 0
            open_[key] = (members, size)
        buckets.extend(_Bucket(members) for members, _ in open_.values() if members)
        return buckets

    @property
    def params(self) -> list[torch.Tensor]:
        return [p for b in self.buckets for p in b.params]

    # ------------------------------------------------------------------ backward-time work
    def _on_grad_ready(self, p: torch.Tensor) -> None:
        self._reduced.discard(id(p))  # .grad just changed locally
        if not grad_sync_enabled() or p.grad is None:
            return
        task = torch._C._current_graph_task_id()
        if task != self._pass_task:
            if self._pass_task is not None:
                self._abandon_stale_pass()
            torch.autograd.Variable._execution_engine.queue_callback(self._finish_pass)
            self._pass_task = task
        bucket = self._bucket_of[id(p)]
        offset = bucket.offsets[id(p)]
        bucket.flat[offset:offset + p.numel()].view_as(p.grad).copy_(p.grad)
        bucket.ready.add(id(p))
        if len(bucket.ready) == len(bucket.params):
            bucket.work = dist.all_reduce(bucket.flat, group=self.group, async_op=True)

    def _finish_pass(self) -> None:
        """End of a synced backward pass: wait for the launched buckets and write the averages back."""
        self._pass_task = None
        for bucket in self.buckets:
            if bucket.work is not None:
                bucket.work.wait()
                bucket.work = None
                for p in bucket.params:  # divide while copying back: one pass over the bucket
                    offset = bucket.offsets[id(p)]
                    torch.div(bucket.flat[offset:offset + p.numel()].view_as(p.grad), self.world, out=p.grad)
                    self._reduced.add(id(p))
            bucket.ready.clear()  # partly filled buckets fall back to the after-backward path

    def _abandon_stale_pass(self) -> None:
        # A previous backward that raised never ran its end callback. Finish its collectives (all
        # ranks issued them) but use none of the results: those gradients were never copied back
        # and their parameters already left ``_reduced`` when their hooks fired.
        for bucket in self.buckets:
            if bucket.work is not None:
                bucket.work.wait()
                bucket.work = None
            bucket.ready.clear()

    # ------------------------------------------------------------------ optimizer-side API
    def unreduced(self, params: list[torch.Tensor]) -> list[torch.Tensor]:
        """Those of ``params`` with a gradient that is not yet the DP average."""
        return [p for p in params if p.grad is not None and id(p) not in self._reduced]

    def mark_reduced(self, params: list[torch.Tensor]) -> None:
        """Record that ``params``' gradients were averaged elsewhere. Only hooked parameters are
        remembered: a change to any other gradient would go unnoticed."""
        self._reduced.update(id(p) for p in params if id(p) in self._bucket_of)

    def reset(self) -> None:
        """Forget which gradients are averaged (after the optimizer consumed them or zeroed them)."""
        self._reduced.clear()

    def remove(self) -> None:
        """Unregister the hooks; later backward passes leave the DP average to the optimizer."""
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._reduced.clear()
