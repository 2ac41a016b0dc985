"""Plain tensors from and to the row-sharded DTensors ``fully_shard`` (nxd-fsdp) makes parameters of,
for code that reads or writes whole parameters (state dicts, expert gathers, Hugging Face import
and export, LoRA adapters) under any data-parallel strategy."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, distribute_tensor


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's piece of ``t`` (``t`` itself when it is not a DTensor)."""
    return t.to_local() if isinstance(t, DTensor) else t


def _shard_dim(t: DTensor) -> int:
    dims = [i for i, placement in enumerate(t.placements) if placement.is_shard()]
    if len(dims) != 1 or t.placements[dims[0]].dim != 0:
        raise ValueError(f"expected a DTensor sharded along dim 0 over one mesh dimension, got {t.placements}")
    return dims[0]


def full_rows(t: torch.Tensor, group: Any) -> torch.Tensor:
    """The whole of ``t`` (a DTensor sharded along dim 0 over ``group``, as ``fully_shard`` cuts:
    ``torch.chunk``'s split) as a plain tensor; a plain tensor is returned as is. Collective over
    ``group``. Padded to equal pieces (gloo has no uneven all-gather).

    The caller names the group, and plain collectives run, not ``DTensor.full_tensor`` or
    ``t.device_mesh``'s groups: DTensor caches meshes and redistribution plans by mesh equality,
    which ignores the process groups, so after a parallel context is rebuilt on the same ranks in
    the same process ``t.device_mesh`` may hold a destroyed group."""
    if not isinstance(t, DTensor):
        return t
    _shard_dim(t)
    if group is None:
        raise ValueError("full_rows of a DTensor needs the process group it is sharded over")
    piece, shape = t.to_local(), t.shape
    count = dist.get_world_size(group)
    if count == 1:
        return piece.clone()
    per = -(-shape[0] // count)
    padded = piece.new_zeros((per, *shape[1:]))
    padded[:piece.shape[0]] = piece
    pieces = [torch.empty_like(padded) for _ in range(count)]
    dist.all_gather(pieces, padded, group=group)
    return torch.cat(pieces)[:shape[0]]


def shard_like(value: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """``value`` (the whole tensor, on every rank) cut as ``param`` is, when ``param`` is a DTensor:
    each rank keeps its own piece, nothing is sent. Otherwise ``value`` as is."""
    if not isinstance(param, DTensor) or isinstance(value, DTensor):
        return value
    return distribute_tensor(value.to(param.dtype), param.device_mesh, param.placements, src_data_rank=None)


#: the attribute a strategy that cuts parameters into row-sharded DTensors (nxd-fsdp) sets on each:
#: the process group its rows are cut over. Not ``param.device_mesh``'s group: DTensor and DeviceMesh
#: cache meshes by equality, so a parameter's mesh may be an equal one of an earlier parallel
#: context, whose groups are destroyed (seen in the tests' reused rank pools: "Could not resolve the
#: process group registered under the name 3")
SHARD_GROUP = "row_shard_group"


def whole(param: torch.Tensor) -> torch.Tensor:
    """The whole of a parameter ``fully_shard`` cut into rows (its TP-local tensor, as without FSDP)
    as a plain tensor, gathered over its :data:`SHARD_GROUP` (HSDP: within one replica); a plain
    tensor is returned as is. Collective over that group."""
    if not isinstance(param, DTensor):
        return param
    group = getattr(param, SHARD_GROUP, None)
    if group is None:
        raise ValueError(f"a row-sharded DTensor parameter {list(param.shape)} does not name the group it is "
                         f"sharded over ({SHARD_GROUP}); the strategy that sharded it sets it")
    return full_rows(param, group)


def copy_whole_(param: torch.Tensor, value: torch.Tensor) -> None:
    """Fill ``param`` from ``value``, the whole tensor (every rank holds it): a row-sharded DTensor
    ``param`` keeps only its own rows, nothing is sent. The way a loader writes a parameter under
    any data-parallel strategy (what is loaded before or after ``fully_shard`` is the same)."""
    param.copy_(shard_like(value.to(param.dtype), param))
