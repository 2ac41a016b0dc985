"""``torch_xla.core.xla_model`` (``xm``) on torch.distributed and nxd's device: the calls NxD's
examples and Lightning modules make. Eager execution: ``mark_step`` synchronises the device and step
closures run at once (the step they belong to has already executed). ``groups`` (XLA's replica
groups) name one of nxd's data, tensor or pipeline parallel groups, or the world.

One copy, used by nxd-compat's ``torch_xla`` stand-in and ``nxd_lightning.xm``."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["REDUCE_MAX", "REDUCE_MIN", "REDUCE_MUL", "REDUCE_SUM", "add_step_closure", "all_gather", "all_reduce",
           "get_local_ordinal", "get_ordinal", "is_master_ordinal", "mark_step", "master_print", "mesh_reduce",
           "optimizer_step", "reduce_gradients", "rendezvous", "save", "wait_device_ops", "xla_device", "xrt_world_size"]

REDUCE_SUM = "sum"
REDUCE_MAX = "max"
REDUCE_MIN = "min"
REDUCE_MUL = "mul"
_OPS = {REDUCE_SUM: dist.ReduceOp.SUM, REDUCE_MAX: dist.ReduceOp.MAX, REDUCE_MIN: dist.ReduceOp.MIN,
        REDUCE_MUL: dist.ReduceOp.PRODUCT}


def xla_device(n: int | None = None, devkind: str | None = None) -> torch.device:
    from nxd_core_parallel.backends import get_device

    return get_device()


def get_ordinal(defval: int = 0) -> int:
    return dist.get_rank() if dist.is_initialized() else defval


def get_local_ordinal(defval: int = 0) -> int:
    return int(os.environ.get("LOCAL_RANK", get_ordinal(defval)))


def xrt_world_size(defval: int = 1) -> int:
    return dist.get_world_size() if dist.is_initialized() else defval


def is_master_ordinal(local: bool = True) -> bool:
    return (get_local_ordinal() if local else get_ordinal()) == 0


def master_print(*args: Any, fd: Any = None, **kwargs: Any) -> None:
    if get_ordinal() == 0:
        print(*args, **kwargs)


def mark_step(wait: bool = False) -> None:
    from nxd_core_parallel.backends import synchronize

    synchronize()


def wait_device_ops(devices: Any = None) -> None:
    mark_step()


def add_step_closure(closure: Callable[..., Any], args: tuple = (), run_async: bool = False) -> None:
    closure(*args)


def rendezvous(tag: str, payload: bytes = b"", replicas: Sequence[int] = ()) -> list[bytes]:
    """All ranks meet here; returns every rank's ``payload``."""
    if not dist.is_initialized():
        return [payload]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, payload)
    return gathered


def _my_group(groups: Sequence[Any] | None) -> Any:
    """The nxd process group whose ranks are this rank's entry of XLA's ``groups``."""
    if not groups:
        return None
    ranks = list(groups) if all(isinstance(g, int) for g in groups) else next(
        (list(g) for g in groups if get_ordinal() in g), None)
    if ranks is None:
        raise ValueError(f"xm: rank {get_ordinal()} is in none of the replica groups {groups!r}")
    if sorted(ranks) == list(range(xrt_world_size())):
        return None
    from nxd_core_parallel import parallel_state as ps

    for getter in (ps.get_data_parallel_group, ps.get_tensor_model_parallel_group,
                   ps.get_pipeline_model_parallel_group):
        if sorted(getter(as_list=True)) == sorted(ranks):
            return getter()
    raise ValueError(f"xm: replica group {ranks} is not one of nxd's data, tensor or pipeline parallel groups; "
                     "pass groups=parallel_state.get_*_group(as_list=True)")


def all_reduce(reduce_type: str, inputs: Any, scale: float = 1.0, groups: Sequence[Any] | None = None,
               pin_layout: bool = True) -> Any:
    """A tensor in, a new reduced tensor out; a list of tensors is reduced in place."""
    if reduce_type not in _OPS:
        raise ValueError(f"xm.all_reduce: reduce_type must be one of {sorted(_OPS)}, got {reduce_type!r}")
    group = _my_group(groups)
    tensors = inputs if isinstance(inputs, list) else [inputs.clone()]
    for t in tensors:
        if dist.is_initialized():
            dist.all_reduce(t, op=_OPS[reduce_type], group=group)
        if scale != 1.0:
            t.mul_(scale)
    return inputs if isinstance(inputs, list) else tensors[0]


def all_gather(value: torch.Tensor, dim: int = 0, groups: Sequence[Any] | None = None, output: Any = None,
               pin_layout: bool = True) -> torch.Tensor:
    group = _my_group(groups)
    if not dist.is_initialized():
        return value
    parts = [torch.empty_like(value) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, value.contiguous(), group=group)
    return torch.cat(parts, dim=dim)


def mesh_reduce(tag: str, data: Any, reduce_fn: Callable[[list[Any]], Any]) -> Any:
    if not dist.is_initialized():
        return reduce_fn([data])
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, data)
    return reduce_fn(gathered)


def optimizer_step(optimizer: Any, barrier: bool = False, optimizer_args: dict | None = None,
                   groups: Any = None, pin_layout: bool = True) -> Any:
    return optimizer.step(**(optimizer_args or {}))


def reduce_gradients(optimizer: Any, groups: Sequence[Any] | None = None, pin_layout: bool = True) -> None:
    """torch-xla's: sum every gradient the optimizer holds over ``groups`` and scale by 1 / world
    size (torch-xla divides by the world size even when ``groups`` is a subset, and so does this)."""
    count = xrt_world_size()
    if count > 1:
        grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        all_reduce(REDUCE_SUM, grads, scale=1.0 / count, groups=groups, pin_layout=pin_layout)


def save(data: Any, file_or_path: Any, master_only: bool = True, global_master: bool = False) -> None:
    if not master_only or is_master_ordinal(local=not global_master):
        torch.save(data, file_or_path)
    if dist.is_initialized():
        dist.barrier()
