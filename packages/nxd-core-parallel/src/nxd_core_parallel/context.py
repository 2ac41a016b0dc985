"""Build the :class:`nxd.parallel.ParallelContext`: NxD's rank layout turned into process groups."""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import torch.distributed as dist

import nxd
from nxd.parallel import DEFAULT_TIMEOUT, ParallelContext, ParallelDim, kv_shared_layout, rank_layout


class _GroupMaker:
    """Creates each distinct rank list's group once, with the configured timeout.

    ``new_group`` is collective over the world: every rank creates every group, in the same order;
    a dimension of size 1 re-uses the singleton groups another dimension already made.

    In a world of torch's ``fake`` backend (nxd-plan's dry run of one rank of a large world) a rank
    creates only its own groups (``use_local_synchronization``): the rest are never used there, and
    creating a 1024-rank world's every group took most of a plan's time. Real backends keep the
    collective creation: a local group's name is a hash of its ranks and the number of groups alive,
    which repeats when a context is destroyed and built again (as rank pools do), and its
    rendezvous would then read the previous group's store keys.
    """

    def __init__(self, rank: int, timeout: timedelta) -> None:
        self.rank, self.timeout = rank, timeout
        self._made: dict[tuple[int, ...], Any] = {}
        self._local = dist.get_backend() == "fake"

    def dim(self, name: str, all_ranks: list[list[int]]) -> ParallelDim:
        mine: ParallelDim | None = None
        frozen = tuple(tuple(ranks) for ranks in all_ranks)
        for ranks in frozen:
            if ranks not in self._made and (self.rank in ranks or not self._local):
                self._made[ranks] = dist.new_group(list(ranks), timeout=self.timeout,
                                                   use_local_synchronization=self._local)
            if self.rank in ranks:
                mine = ParallelDim(name, len(ranks), ranks.index(self.rank), ranks, self._made[ranks], frozen)
        if mine is None:
            raise RuntimeError(f"rank {self.rank} is in no {name} group of {all_ranks}")
        return mine


def build_parallel_context(
    tensor_model_parallel_size: int = 1,
    pipeline_model_parallel_size: int = 1,
    context_parallel_size: int = 1,
    expert_model_parallel_size: int = 1,
    *,
    backend: Any = None,
    timeout: timedelta | None = None,
) -> ParallelContext:
    """Create every group of every dimension. Collective: every rank calls it with the same sizes.

    ``backend`` is a registered backend object (default: the one ``NXD_BACKEND`` pins, else the one
    the default process group uses, found through ``nxd.get_backend``); it supplies the device.
    """
    from nxd.parallel import backend_for_process_group

    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("initialize_model_parallel needs torch.distributed.init_process_group() to have run first")
    tp, pp = int(tensor_model_parallel_size), int(pipeline_model_parallel_size)
    cp, ep = int(context_parallel_size), int(expert_model_parallel_size)
    world, rank = dist.get_world_size(), dist.get_rank()
    layout = rank_layout(world, tp=tp, pp=pp, cp=cp, ep=ep)
    if backend is None:
        # A pin wins (e.g. nxd-compat-run: an "xla"-named process group emulated on gloo/NCCL).
        pinned = os.environ.get("NXD_BACKEND")
        backend = nxd.get_backend(pinned) if pinned else backend_for_process_group()
    timeout = timeout or DEFAULT_TIMEOUT
    make = _GroupMaker(rank, timeout)
    dims = {name: make.dim(name, layout[name]) for name in ("tp", "dp", "pp", "cp", "dp_cp", "ep", "edp")}
    kv_shared = {m: make.dim("kv_shared", kv_shared_layout(layout["tp"], m)) for m in range(2, tp + 1) if tp % m == 0}
    return ParallelContext(world_size=world, rank=rank, backend=backend, device=backend.device(), timeout=timeout,
                           kv_shared=kv_shared, **dims)


def start_parallel_context(tp: int = 1, pp: int = 1, cp: int = 1, ep: int = 1, *,
                           timeout: timedelta | None = None) -> ParallelContext:
    """The current context when it has these sizes (and ``timeout``, when given), else a new one
    built and made current (the old one's groups destroyed). Every rank must call it with the same
    sizes. NxD's ``parallel_state.initialize_model_parallel`` is this under NxD's argument names."""
    from nxd.parallel import current_parallel_context, destroy_parallel_context, set_parallel_context

    sizes = (int(tp), int(pp), int(cp), int(ep))
    current = current_parallel_context()
    if current is not None:
        same_timeout = timeout is None or current.timeout == timeout
        if (current.tp.size, current.pp.size, current.cp.size, current.ep.size) == sizes and same_timeout:
            return current
        destroy_parallel_context()
    context = build_parallel_context(*sizes, timeout=timeout)
    set_parallel_context(context)
    return context
