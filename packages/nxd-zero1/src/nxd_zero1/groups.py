"""Process groups the optimizer shards over and reduces the gradient norm over."""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from nxd import current_parallel_context
from nxd.parallel import process_group_timeout

_DEFAULT_DIMS = {"data": "dp", "tensor": "tp", "pipeline": "pp"}


def resolve_group(spec: Any, default: str) -> Any:
    """Turn ``spec`` into a process group.

    ``spec`` may be a ProcessGroup, ``None`` (use ``default``: ``"data"`` = parallel_state's DP
    group, or the world group when model parallelism is not initialised; ``"tensor"`` /
    ``"pipeline"`` = those groups, or ``None`` when not initialised), or NxD's list-of-lists of
    global ranks (every rank must pass the same lists; a group is created per list and this
    rank's is returned).
    """
    context = current_parallel_context()
    if spec is None:
        if context is None:
            return dist.group.WORLD if default == "data" else None
        return context.dim(_DEFAULT_DIMS[default]).group
    if isinstance(spec, (list, tuple)) and spec and all(isinstance(r, int) for r in spec):
        # parallel_state's ``as_list=True`` form: this rank's own group as a list of ranks
        for name in ("dp", "tp", "pp"):
            if context is not None and list(context.dim(name).ranks) == list(spec):
                return context.dim(name).group
        raise ValueError(f"rank list {list(spec)} is not one of parallel_state's DP/TP/PP groups; pass a "
                         "ProcessGroup or a list of lists of ranks (one per group) instead")
    if isinstance(spec, (list, tuple)):
        if not all(isinstance(g, (list, tuple)) for g in spec):
            raise ValueError(f"a rank-list group spec must be a list of lists of global ranks, got {spec!r}")
        me, mine = dist.get_rank(), None
        for ranks in spec:
            group = dist.new_group([int(r) for r in ranks], timeout=process_group_timeout())
            if me in ranks:
                mine = group
        if mine is None:
            raise ValueError(f"rank {me} is in none of the groups {spec!r}")
        return mine
    return spec


def group_size(group: Any) -> int:
    return 1 if group is None else dist.get_world_size(group)


def group_rank(group: Any) -> int:
    return 0 if group is None else dist.get_rank(group)


def backend_name(group: Any) -> str:
    return str(dist.get_backend(group)).lower()
