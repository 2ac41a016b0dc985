"""This rank's place in the (TP, DP, PP) layout, read from the core's parallel context.

Without model parallelism initialised every rank is a data-parallel replica (TP = PP = 1); without
torch.distributed there is one rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from nxd import current_parallel_context


@dataclass(frozen=True)
class Topology:
    rank: int
    world: int
    tp: int
    pp: int
    dp: int
    tp_rank: int
    pp_rank: int
    dp_rank: int

    @property
    def distributed(self) -> bool:
        return self.world > 1

    def degrees(self) -> dict[str, int]:
        return {"tp": self.tp, "pp": self.pp, "dp": self.dp, "world": self.world}


def current_topology() -> Topology:
    if not (dist.is_available() and dist.is_initialized()):
        return Topology(0, 1, 1, 1, 1, 0, 0, 0)
    rank, world = dist.get_rank(), dist.get_world_size()
    context = current_parallel_context()
    if context is None:
        return Topology(rank, world, 1, 1, world, 0, 0, rank)
    return Topology(rank, world, context.tp.size, context.pp.size, context.dp.size,
                    context.tp.rank, context.pp.rank, context.dp.rank)


def all_gather_objects(obj: Any, group: Any = None) -> list[Any]:
    """Every rank's ``obj`` (one element when not distributed)."""
    if not (dist.is_available() and dist.is_initialized()):
        return [obj]
    out: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, obj, group=group)
    return out


def barrier(group: Any = None) -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier(group=group)
