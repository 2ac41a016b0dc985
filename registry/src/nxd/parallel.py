"""The parallel context: one object that says where this rank sits in every parallel dimension.

The ``nxd_initialize_parallel`` hook builds it (nxd-core-parallel does, from the registered
backend) and the core keeps the current one; every package reads topology from here, never from
another package's module state. ``nxd_core_parallel.parallel_state`` is NxD's API over it.

Dimensions, in NxD's rank order (the last one varies fastest)::

    non-expert regions:  global rank = ((pp * DP + dp) * CP + cp) * TP + tp      [PP, DP, CP, TP]
    expert regions:      global rank = ((pp * EDP + edp) * EP + ep) * TP + tp    [PP, EDP, EP, TP]

with ``EDP * EP == DP * CP``: an expert region re-reads the data x context ranks as expert-data x
expert-model ranks, so a rank keeps its TP and PP coordinates in both regions (NxD's
``initialize_model_parallel`` layout, with context parallelism between tensor and data).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from nxd.errors import ComponentNotFound

#: Timeout of every process group nxd creates (torch's own default for the default group).
DEFAULT_TIMEOUT = timedelta(minutes=30)

#: Every dimension a context carries. ``dp_cp`` is the gradient-reduction group (data x context).
DIMENSIONS = ("tp", "cp", "dp", "pp", "ep", "edp", "dp_cp")

DIMENSION_NAMES = {
    "tp": "tensor_model_parallel", "cp": "context_model_parallel", "dp": "data_parallel",
    "pp": "pipeline_model_parallel", "ep": "expert_model_parallel", "edp": "expert_data_parallel",
    "dp_cp": "data_context_parallel",
}


@dataclass(frozen=True)
class ParallelDim:
    """One dimension as seen from this rank."""

    name: str
    size: int
    #: this rank's index inside its group
    rank: int
    #: global ranks of this rank's group, in group order
    ranks: tuple[int, ...]
    #: the ``torch.distributed`` process group of ``ranks``
    group: Any
    #: every group of this dimension (NxD's replica groups, ``as_list=True``)
    all_ranks: tuple[tuple[int, ...], ...] = ()

    @property
    def src_rank(self) -> int:
        """Global rank of this group's first member."""
        return self.ranks[0]

    @property
    def enabled(self) -> bool:
        return self.size > 1


@dataclass
class ParallelContext:
    """Sizes, ranks, groups and the device of every parallel dimension of this rank."""

    world_size: int
    rank: int
    backend: Any
    device: torch.device
    timeout: timedelta
    tp: ParallelDim
    cp: ParallelDim
    dp: ParallelDim
    pp: ParallelDim
    ep: ParallelDim
    edp: ParallelDim
    dp_cp: ParallelDim
    #: GQA KV replication: multiplier m -> the m consecutive TP ranks holding the same KV piece
    kv_shared: dict[int, ParallelDim] = field(default_factory=dict)

    def __deepcopy__(self, memo: dict) -> ParallelContext:
        # one per process, holding process groups: a deep-copied model shares its original's context
        return self

    def dim(self, name: str) -> ParallelDim:
        if name not in DIMENSIONS:
            raise KeyError(f"no parallel dimension {name!r}; dimensions: {', '.join(DIMENSIONS)}")
        return getattr(self, name)

    def kv_shared_dim(self, kv_size_multiplier: int) -> ParallelDim:
        """The TP ranks holding the same replicated KV piece for ``kv_size_multiplier`` m (this
        rank's block of m consecutive TP ranks)."""
        if kv_size_multiplier not in self.kv_shared:
            raise ValueError(
                f"kv_size_multiplier={kv_size_multiplier} must divide tensor_model_parallel_size={self.tp.size} "
                "and be > 1"
            )
        return self.kv_shared[kv_size_multiplier]

    def sizes(self) -> dict[str, int]:
        return {name: self.dim(name).size for name in DIMENSIONS}

    def coordinates(self) -> dict[str, int]:
        """This rank's index in each dimension."""
        return {name: self.dim(name).rank for name in DIMENSIONS}

    def is_first_stage(self) -> bool:
        return self.pp.rank == 0

    def is_last_stage(self) -> bool:
        return self.pp.rank == self.pp.size - 1

    def groups(self) -> list[Any]:
        """Every distinct process group of this context (for teardown)."""
        seen: dict[int, Any] = {}
        for dim in [*(self.dim(n) for n in DIMENSIONS), *self.kv_shared.values()]:
            if dim.group is not None:
                seen.setdefault(id(dim.group), dim.group)
        return list(seen.values())

    def destroy(self) -> None:
        """Destroy this context's groups (the default process group stays)."""
        for group in self.groups():
            if group is dist.group.WORLD:
                continue
            try:
                dist.destroy_process_group(group)
            except (RuntimeError, ValueError):  # already gone with the default group
                pass


def rank_layout(world_size: int, tp: int = 1, pp: int = 1, cp: int = 1, ep: int = 1) -> dict[str, list[list[int]]]:
    """Every group of every dimension for these sizes (pure: no processes needed).

    Raises ``ValueError`` naming the sizes when they do not divide the world.
    """
    for name, size in (("tensor_model_parallel_size", tp), ("pipeline_model_parallel_size", pp),
                       ("context_parallel_size", cp), ("expert_model_parallel_size", ep)):
        if int(size) < 1:
            raise ValueError(f"{name} must be >= 1, got {size}")
    extra = {"context_parallel_size": cp} if cp > 1 else {}
    dp = check_divisible(world_size, tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, **extra)
    if (dp * cp) % ep:
        raise ValueError(
            f"expert_model_parallel_size ({ep}) must divide data_parallel_size x context_parallel_size "
            f"({dp} x {cp} = {dp * cp}) for world size {world_size}"
        )
    edp = dp * cp // ep

    def rank(p: int, d: int, c: int, t: int) -> int:
        return ((p * dp + d) * cp + c) * tp + t

    def erank(p: int, e_d: int, e: int, t: int) -> int:
        return ((p * edp + e_d) * ep + e) * tp + t

    P, D, C, T, E, ED = range(pp), range(dp), range(cp), range(tp), range(ep), range(edp)
    return {
        "tp": [[rank(p, d, c, t) for t in T] for p in P for d in D for c in C],
        "cp": [[rank(p, d, c, t) for c in C] for p in P for d in D for t in T],
        "dp": [[rank(p, d, c, t) for d in D] for p in P for c in C for t in T],
        "pp": [[rank(p, d, c, t) for p in P] for d in D for c in C for t in T],
        "dp_cp": [[rank(p, d, c, t) for d in D for c in C] for p in P for t in T],
        "ep": [[erank(p, e_d, e, t) for e in E] for p in P for e_d in ED for t in T],
        "edp": [[erank(p, e_d, e, t) for e_d in ED] for p in P for e in E for t in T],
    }


def check_divisible(world_size: int, **sizes: int) -> int:
    """The data-parallel size implied by ``sizes``; raises ``ValueError`` when their product does
    not divide ``world_size`` (the one place nxd checks this)."""
    product = 1
    for size in sizes.values():
        product *= int(size)
    if product < 1 or world_size % product:
        names = " x ".join(f"{k} ({v})" for k, v in sizes.items())
        raise ValueError(
            f"world size {world_size} is not divisible by {names} = {product}; "
            f"choose sizes whose product divides {world_size}"
        )
    return world_size // product


def kv_shared_layout(tp_groups: list[list[int]], multiplier: int) -> list[list[int]]:
    """GQA KV replication with multiplier m: the m consecutive TP ranks j*m .. j*m + m - 1 of each
    TP group hold the same KV piece j (GQAQKVColumnParallelLinear's layout)."""
    return [group[j * multiplier:(j + 1) * multiplier] for group in tp_groups
            for j in range(len(group) // multiplier)]


# ---------------------------------------------------------------- the current context
_CURRENT: ParallelContext | None = None


def current_parallel_context() -> ParallelContext | None:
    """The context of this process, or ``None`` before model parallelism is initialised."""
    return _CURRENT


def get_parallel_context() -> ParallelContext:
    """The context of this process; raises when model parallelism is not initialised."""
    if _CURRENT is None:
        raise RuntimeError(
            "model parallel is not initialized: call nxd.neuronx_distributed_config(...) after "
            "torch.distributed.init_process_group(), or parallel_state.initialize_model_parallel()"
        )
    return _CURRENT


def resolve_context(context: ParallelContext | None = None) -> ParallelContext | None:
    """``context``, else the current one: the single fallback NxD's own entry points use (a layer built
    NxD-style without ``context=``, a ``parallel_state``-era function called without groups). nxd's
    internals pass the context they were given instead of calling this with ``None``."""
    return context if context is not None else _CURRENT


def dim_size(context: ParallelContext | None, name: str) -> int:
    """Size of dimension ``name`` in ``context`` (1 without model parallelism)."""
    return context.dim(name).size if context is not None else 1


def dim_rank(context: ParallelContext | None, name: str) -> int:
    """This rank's index in dimension ``name`` of ``context`` (0 without model parallelism)."""
    return context.dim(name).rank if context is not None else 0


def dim_group(context: ParallelContext | None, name: str) -> Any:
    """The process group of dimension ``name`` in ``context`` (``None`` without model parallelism)."""
    return context.dim(name).group if context is not None else None


def set_parallel_context(context: ParallelContext | None) -> ParallelContext | None:
    """Make ``context`` current; returns the previous one (the caller decides whether to destroy it)."""
    global _CURRENT
    previous, _CURRENT = _CURRENT, context
    return previous


def destroy_parallel_context() -> None:
    """Destroy the current context's groups and forget it."""
    previous = set_parallel_context(None)
    if previous is not None:
        previous.destroy()


# ---------------------------------------------------------------- passing the context explicitly
def accepts_context(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` names a ``context`` parameter. Contracts hand the parallel context only to the
    callables that ask for it, as pluggy hands a hook implementation only the arguments it names, so
    components written before the context existed keep working."""
    try:
        return "context" in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # builtins and C callables without a signature
        return False


def call_with_context(fn: Callable[..., Any], *args: Any, context: ParallelContext | None, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, plus ``context=context`` when ``fn`` names a ``context`` parameter."""
    if accepts_context(fn):
        kwargs["context"] = context
    return fn(*args, **kwargs)


def bind_context(fn: Callable[..., Any], context: ParallelContext | None) -> Callable[..., Any]:
    """``fn`` with ``context`` bound when it names a ``context`` parameter, else ``fn`` itself."""
    return functools.partial(fn, context=context) if accepts_context(fn) else fn


def backend_for_process_group(process_group_backend: str | None = None) -> Any:
    """The registered backend whose ``process_group_backend`` the default process group uses
    (``gloo`` -> ``cpu``, ``nccl`` -> ``cuda``, ``xla`` -> ``xla``, another device's default backend
    -> ``accelerator``); ``cpu`` when none is running."""
    from nxd.lookup import get_backend, list_components

    if process_group_backend is None:
        if not (dist.is_available() and dist.is_initialized()):
            return get_backend("cpu")
        process_group_backend = str(dist.get_backend())
    # a backend named for the device (cuda) before the generic one (accelerator) that may also use it
    names = sorted(list_components("backend"), key=lambda n: bool(getattr(get_backend(n), "generic", False)))
    for name in names:
        if get_backend(name).process_group_backend == process_group_backend:
            return get_backend(name)
    for name in names:  # composite names such as "cpu:gloo,cuda:nccl"
        uses = get_backend(name).process_group_backend  # None: a backend with no device here
        if uses and uses in process_group_backend and name != "cpu":
            return get_backend(name)
    if "cpu" in names:
        return get_backend("cpu")
    raise ComponentNotFound(
        f"no registered backend uses process-group backend {process_group_backend!r}; "
        "pip install nxd-core-parallel (backends cpu/gloo, cuda/nccl, xla)"
    )


def process_group_timeout() -> timedelta:
    """The timeout for a new process group: the current context's, else :data:`DEFAULT_TIMEOUT`."""
    return _CURRENT.timeout if _CURRENT is not None else DEFAULT_TIMEOUT
