"""Raw (non-autograd) collectives over a group, concatenating along a tensor dimension.

Gloo has no reduce-scatter, so it is an all-reduce followed by taking this rank's slice.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from nxd.parallel import dim_group, resolve_context


def group_size(group: Any) -> int:
    return dist.get_world_size(group)


def trivial(group: Any) -> bool:
    """No collective is needed over ``group``: there is none (one process, no model parallelism)
    or it has one rank."""
    return group is None or dist.get_world_size(group) == 1


def tp_group(process_group: Any = None) -> Any:
    """``process_group``, else (NxD's call without one: user code) the current context's TP group;
    ``None`` without model parallelism."""
    return process_group if process_group is not None else dim_group(resolve_context(), "tp")


def group_rank(group: Any) -> int:
    return dist.get_rank(group)


def all_reduce(tensor: torch.Tensor, group: Any, op: Any = dist.ReduceOp.SUM) -> torch.Tensor:
    tensor = tensor.contiguous()
    dist.all_reduce(tensor, op=op, group=group)
    return tensor


def all_gather(tensor: torch.Tensor, dim: int, group: Any) -> torch.Tensor:
    size = group_size(group)
    if size == 1:
        return tensor
    tensor = tensor.contiguous()
    parts = [torch.empty_like(tensor) for _ in range(size)]
    dist.all_gather(parts, tensor, group=group)
    return torch.cat(parts, dim=dim)


def split(tensor: torch.Tensor, dim: int, group: Any) -> torch.Tensor:
    size = group_size(group)
    if size == 1:
        return tensor
    length = tensor.size(dim)
    if length % size:
        raise ValueError(f"dimension {dim} of size {length} is not divisible by tensor parallel size {size}")
    return tensor.narrow(dim, group_rank(group) * (length // size), length // size).contiguous()


def reduce_scatter(tensor: torch.Tensor, dim: int, group: Any) -> torch.Tensor:
    size = group_size(group)
    if size == 1:
        return tensor
    if dist.get_backend(group) != "gloo":
        chunks = [c.contiguous() for c in tensor.chunk(size, dim=dim)]
        if tensor.size(dim) % size:
            raise ValueError(f"dimension {dim} of size {tensor.size(dim)} is not divisible by {size}")
        out = torch.empty_like(chunks[0])
        dist.reduce_scatter(out, chunks, group=group)
        return out
    return split(all_reduce(tensor.clone(), group), dim, group)
