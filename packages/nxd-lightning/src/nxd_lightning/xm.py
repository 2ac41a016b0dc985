"""The few ``torch_xla.core.xla_model`` calls NxD's Lightning examples make, on ``torch.distributed``.

``import torch_xla.core.xla_model as xm`` becomes ``from nxd_lightning import xm``:
``mark_step`` synchronises the backend (a graph cut on XLA, nothing to do on CPU), ``all_reduce``
takes XLA's ``groups`` (a list of rank lists, or one list of ranks) and returns a new tensor.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

REDUCE_SUM = "sum"
REDUCE_MAX = "max"
REDUCE_MIN = "min"
REDUCE_MUL = "mul"

_OPS = {REDUCE_SUM: dist.ReduceOp.SUM, REDUCE_MAX: dist.ReduceOp.MAX, REDUCE_MIN: dist.ReduceOp.MIN,
        REDUCE_MUL: dist.ReduceOp.PRODUCT}


def mark_step() -> None:
    """End of a step's graph on XLA; elsewhere it waits for queued device work."""
    from nxd_core_parallel.backends import synchronize

    synchronize()


def xla_device() -> torch.device:
    from nxd_core_parallel.backends import get_device

    return get_device()


def get_ordinal() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def xrt_world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def is_master_ordinal(local: bool = True) -> bool:
    return get_ordinal() == 0


def master_print(*args: Any, **kwargs: Any) -> None:
    if get_ordinal() == 0:
        print(*args, **kwargs)


def _my_ranks(groups: Sequence[Any] | None) -> list[int] | None:
    if not groups:
        return None
    if all(isinstance(g, int) for g in groups):
        return list(groups)
    me = get_ordinal()
    for group in groups:
        if me in group:
            return list(group)
    raise ValueError(f"xm.all_reduce: rank {me} is in none of the groups {groups!r}")


def _group_for(ranks: list[int] | None) -> Any:
    """The process group with exactly ``ranks`` (nxd's TP/DP/PP groups, or the world)."""
    if ranks is None or sorted(ranks) == list(range(xrt_world_size())):
        return None
    from nxd_core_parallel import parallel_state as ps

    for getter in (ps.get_data_parallel_group, ps.get_tensor_model_parallel_group, ps.get_pipeline_model_parallel_group):
        if sorted(getter(as_list=True)) == sorted(ranks):
            return getter()
    raise ValueError(f"xm.all_reduce: ranks {ranks} are not nxd's data, tensor or pipeline parallel group; "
                     "pass groups=parallel_state.get_*_group(as_list=True)")


def all_reduce(reduce_type: str, inputs: torch.Tensor | list[torch.Tensor], scale: float = 1.0,
               groups: Sequence[Any] | None = None, pin_layout: bool = True) -> Any:
    """XLA's ``all_reduce``: a tensor in, a reduced new tensor out (a list is reduced in place)."""
    if reduce_type not in _OPS:
        raise ValueError(f"xm.all_reduce: reduce_type must be one of {sorted(_OPS)}, got {reduce_type!r}")
    group = _group_for(_my_ranks(groups))
    tensors = inputs if isinstance(inputs, list) else [inputs.clone()]
    for t in tensors:
        if dist.is_initialized():
            dist.all_reduce(t, op=_OPS[reduce_type], group=group)
        if scale != 1.0:
            t.mul_(scale)
    return inputs if isinstance(inputs, list) else tensors[0]


def add_step_closure(closure: Any, args: tuple = (), run_async: bool = False) -> None:
    """XLA runs ``closure(*args)`` once the step's graph has executed; eager execution already has."""
    closure(*args)


def rendezvous(tag: str, payload: bytes = b"", replicas: Sequence[int] = ()) -> list[bytes]:
    """Every rank meets here; returns every rank's ``payload`` (XLA's ``xm.rendezvous``)."""
    if not dist.is_initialized():
        return [payload]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, payload)
    return gathered
