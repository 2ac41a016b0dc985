"""``neuronx_distributed.parallel_layers.mappings``: autograd-aware TP/SP collectives.

The public regions are nxd-tensor-parallel's. NxD's raw helpers that its examples call directly
(``_split_along_first_dim``, ``_gather_along_first_dim``, ``_reduce``, ``_reduce_scatter_along_*``,
...) are here with NxD's signatures: plain collectives over the TP group (or ``process_group``),
no autograd, as in NxD; so are its region autograd classes (``_CopyToModelParallelRegion.apply``
...: NxD's positional arguments, nxd's regions). Expert-parallel regions, input-channel scatters
and NxD's SPMD (inference tracing) scatters raise, naming what to use instead.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch
import torch.distributed as dist

from nxd_tensor_parallel.parallel_layers import comm
from nxd_tensor_parallel.parallel_layers.mappings import *  # noqa: F403
from nxd_tensor_parallel.parallel_layers.mappings import (
    _tp_group,
    _trivial,
    copy_to_tensor_model_parallel_region,
    gather_from_sequence_parallel_region,
    gather_from_tensor_model_parallel_region,
    reduce_from_tensor_model_parallel_region,
    reduce_scatter_to_sequence_parallel_region,
    scatter_to_sequence_parallel_region,
    scatter_to_tensor_model_parallel_region,
)

_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN, "mul": dist.ReduceOp.PRODUCT}
_NOT_PROVIDED = {
    "_all_to_all_in_expert_parallel_region": "nxd-moe's expert parallelism (nxd_moe, all-to-all over the EP group)",
    "enter_expert_parallel_region": "nxd-moe's expert parallelism (nxd_moe, all-to-all over the EP group)",
    "exit_expert_parallel_region": "nxd-moe's expert parallelism (nxd_moe, all-to-all over the EP group)",
    "scatter_to_process_group_spmd": "scatter_to_tensor_model_parallel_region (NxD's SPMD form is for traced inference)",
    "round_robin_scatter_to_process_group_spmd": "scatter_to_tensor_model_parallel_region (SPMD inference form)",
    "scatter_input_channels_to_tensor_model_parallel_region": "nothing: nxd has no TP-sharded convolution",
    "_AllToAllInExpertParallelRegion": "nxd-moe's expert parallelism (nxd_moe, all-to-all over the EP group)",
    "_ScatterInputChannelsToModelParallelRegion": "nothing: nxd has no TP-sharded convolution",
    "_ScatterToProcessGroupSPMD": "scatter_to_tensor_model_parallel_region (NxD's SPMD form is for traced inference)",
    "_RoundRobinScatterToProcessGroupSPMD": "scatter_to_tensor_model_parallel_region (SPMD inference form)",
}


def _op(computation: Any) -> Any:
    return _OPS.get(computation, computation) if isinstance(computation, str) else computation


def _reduce(input_: torch.Tensor, computation: Any = "sum", process_group: Any = None) -> torch.Tensor:
    """All-reduce over the TP group (in place, as NxD)."""
    group = _tp_group(process_group)
    return input_ if _trivial(group) else comm.all_reduce(input_, group, _op(computation))


def _split_along_dim(input_: torch.Tensor, partition_dim: int, process_group: Any = None) -> torch.Tensor:
    group = _tp_group(process_group)
    return input_ if _trivial(group) else comm.split(input_, partition_dim, group)


def _split_along_first_dim(input_: torch.Tensor, process_group: Any = None) -> torch.Tensor:
    return _split_along_dim(input_, 0, process_group)


def _split_along_last_dim(input_: torch.Tensor, process_group: Any = None) -> torch.Tensor:
    return _split_along_dim(input_, input_.dim() - 1, process_group)


def _gather_along_dim(x: torch.Tensor, partition_dim: int, process_group: Any = None, tile_cc: bool = False) -> torch.Tensor:
    group = _tp_group(process_group)
    return x if _trivial(group) else comm.all_gather(x, partition_dim, group)


def _gather_along_first_dim(x: torch.Tensor, process_group: Any = None) -> torch.Tensor:
    return _gather_along_dim(x, 0, process_group)


def _gather_along_last_dim(x: torch.Tensor, process_group: Any = None) -> torch.Tensor:
    return _gather_along_dim(x, x.dim() - 1, process_group)


def _reduce_scatter_along_dim(x: torch.Tensor, partition_dim: int, computation: Any = "sum", process_group: Any = None,
                              tile_cc: bool = False) -> torch.Tensor:
    group = _tp_group(process_group)
    if _trivial(group):
        return x
    if _op(computation) != dist.ReduceOp.SUM:
        x = comm.all_reduce(x.clone(), group, _op(computation))
        return comm.split(x, partition_dim, group)
    return comm.reduce_scatter(x, partition_dim, group)


def _reduce_scatter_along_first_dim(x: torch.Tensor, computation: Any = "sum", process_group: Any = None) -> torch.Tensor:
    return _reduce_scatter_along_dim(x, 0, computation, process_group)


def _reduce_scatter_along_last_dim(x: torch.Tensor, computation: Any = "sum", process_group: Any = None) -> torch.Tensor:
    return _reduce_scatter_along_dim(x, x.dim() - 1, computation, process_group)


def reduce_from_context_model_parallel_region(input_: torch.Tensor, process_group: Any = None) -> torch.Tensor:
    """Sum over the context-parallel group (identity gradient), NxD's CP reduction."""
    from nxd_core_parallel import parallel_state

    group = process_group if process_group is not None else parallel_state.get_context_model_parallel_group()
    return reduce_from_tensor_model_parallel_region(input_, process_group=group)


def reduce_scatter_to_tensor_model_parallel_region_with_dim(input_: torch.Tensor, partition_dim: int,
                                                            process_group: Any = None) -> torch.Tensor:
    return reduce_scatter_to_sequence_parallel_region(input_, partition_dim, process_group)


def gather_from_tensor_model_parallel_region_with_dim(input_: torch.Tensor, gather_dim: int,
                                                      process_group: Any = None) -> torch.Tensor:
    return gather_from_sequence_parallel_region(input_, gather_dim, False, process_group)


def nonzero_partition_dim_swap(func: Callable[..., Any]) -> Callable[..., Any]:
    """NxD's decorator: ``func(x, partition_dim, ...)`` computed along dim 0 of ``x`` transposed."""

    @functools.wraps(func)
    def wrapped_fn(x: torch.Tensor, partition_dim: int, *args: Any, **kwargs: Any) -> torch.Tensor:
        x_t = x.transpose(0, partition_dim) if partition_dim != 0 else x
        y_t = func(x_t, 0, *args, **kwargs)
        return y_t.transpose(0, partition_dim) if partition_dim != 0 else y_t

    return wrapped_fn


def _region(name: str, fn: Callable[..., torch.Tensor], doc: str) -> type:
    """NxD's autograd class for a region: ``.apply`` with NxD's positional arguments runs nxd's
    region function (its own autograd: the same forward and backward collectives)."""
    return type(name, (), {"__doc__": doc, "apply": staticmethod(fn)})


_CopyToModelParallelRegion = _region(
    "_CopyToModelParallelRegion",
    lambda input_, process_group=None: copy_to_tensor_model_parallel_region(input_, process_group=process_group),
    "identity forward, all-reduced gradient")
_ReduceFromModelParallelRegion = _region(
    "_ReduceFromModelParallelRegion",
    lambda input_, process_group=None: reduce_from_tensor_model_parallel_region(input_, process_group=process_group),
    "all-reduce forward, identity gradient")
_ScatterToModelParallelRegion = _region(
    "_ScatterToModelParallelRegion",
    lambda input_, process_group=None: scatter_to_tensor_model_parallel_region(input_, process_group=process_group),
    "split the last dim forward, all-gathered gradient")
_GatherFromModelParallelRegion = _region(
    "_GatherFromModelParallelRegion",
    lambda input_, process_group=None: gather_from_tensor_model_parallel_region(input_, process_group=process_group),
    "all-gather the last dim forward, split gradient")
_ScatterToSequenceParallelRegion = _region(
    "_ScatterToSequenceParallelRegion",
    lambda input_, partition_dim, process_group=None: scatter_to_sequence_parallel_region(
        input_, partition_dim, process_group), "split ``partition_dim`` forward, all-gathered gradient")
_GatherFromSequenceParallelRegion = _region(
    "_GatherFromSequenceParallelRegion",
    lambda input_, partition_dim, to_model_parallel=True, process_group=None, tile_cc=False:
    gather_from_sequence_parallel_region(input_, partition_dim, to_model_parallel, process_group),
    "all-gather ``partition_dim`` forward; reduce-scattered (or split) gradient")
_ReduceScatterToSequenceParallelRegion = _region(
    "_ReduceScatterToSequenceParallelRegion",
    lambda input_, partition_dim, process_group=None, tile_cc=False, dtype=None:
    reduce_scatter_to_sequence_parallel_region(input_, partition_dim, process_group, reduce_dtype=dtype),
    "reduce-scatter ``partition_dim`` forward, all-gathered gradient")


def __getattr__(name: str) -> Any:
    if name in _NOT_PROVIDED:
        raise NotImplementedError(f"neuronx_distributed.parallel_layers.mappings.{name} is not provided by nxd-compat; "
                                  f"use {_NOT_PROVIDED[name]}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
