"""This rank's place in the (TP, DP, PP) layout, read from nxd-core-parallel's parallel_state.

Without model parallelism initialised every rank is a data-parallel replica (TP = PP = 1); without
torch.distributed there is one rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch.distributed as dist


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


def _parallel_state() -> Any:
    try:
        from nxd_core_parallel import parallel_state
    except ImportError:
        return None
    return parallel_state if parallel_state.model_parallel_is_initialized() else None


def current_topology() -> Topology:
    if not (dist.is_available() and dist.is_initialized()):
        return Topology(0, 1, 1, 1, 1, 0, 0, 0)
    rank, world = dist.get_rank(), dist.get_world_size()
    ps = _parallel_state()
    if ps is None:
        return Topology(rank, world, 1, 1, world, 0, 0, rank)
    return Topology(
        rank, world,
        ps.get_tensor_model_parallel_size(), ps.get_pipeline_model_parallel_size(), ps.get_data_parallel_size(),
        ps.get_tensor_model_parallel_rank(), ps.get_pipeline_model_parallel_rank(), ps.get_data_parallel_rank(),
    )


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
