"""Process groups the optimizer shards over and reduces the gradient norm over."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from nxd import ParallelContext
from nxd.parallel import process_group_timeout

_DEFAULT_DIMS = {"data": "dp", "tensor": "tp", "pipeline": "pp"}


def resolve_group(spec: Any, default: str, context: ParallelContext | None) -> Any:
    """Turn ``spec`` into a process group.

    ``spec`` may be a ProcessGroup, ``None`` (use ``default``: ``"data"`` = ``context``'s DP
    group, or the world group without a context; ``"tensor"`` / ``"pipeline"`` = those groups, or
    ``None`` without a context), or NxD's list-of-lists of
    global ranks (every rank must pass the same lists; a group is created per list and this
    rank's is returned).
    """
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


@dataclass(frozen=True)
class GroupComm:
    """Where one param group's gradients are reduced and its state is sharded.

    ``group``: the ranks that hold the same parameters; the group's gradients are summed over it
    (then divided by ``divisor``) and its optimizer state is sharded over it. ``partition_group``:
    the ranks holding the other slices, along dimension 0, of this group's parameters (their
    gradient norms add up; checkpoints reshard across its size), or None. ``default``: the
    optimizer's own sharding group with nothing else set.
    """

    group: Any
    size: int
    rank: int
    divisor: float
    partition_group: Any
    default: bool

    @property
    def partition_size(self) -> int:
        return group_size(self.partition_group)

    @property
    def partition_rank(self) -> int:
        return group_rank(self.partition_group)

    @classmethod
    def pop_from(cls, param_group: dict, default_group: Any) -> GroupComm:
        """Read and remove the keys ``sharding_group``, ``gradient_divisor`` and ``partition_group``
        from ``param_group`` (so the inner optimizer and its state dict never see process groups)."""
        group = param_group.pop("sharding_group", None)
        divisor = param_group.pop("gradient_divisor", None)
        partition = param_group.pop("partition_group", None)
        default = group is None and divisor is None and partition is None
        group = default_group if group is None else group
        size = group_size(group)
        divisor = size if divisor is None else divisor
        if not divisor > 0:
            raise ValueError(f"param group gradient_divisor must be positive, got {divisor!r}")
        return cls(group, size, group_rank(group), float(divisor), partition, default)
