"""Plain tensors from and to the row-sharded DTensors ``fully_shard`` (nxd-fsdp) makes parameters of,
for code that reads or writes whole parameters (state dicts, expert gathers) under any
data-parallel strategy."""

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
