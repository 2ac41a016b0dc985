"""Autograd-aware collectives for tensor and sequence parallelism (Megatron/NxD semantics).

Each forward collective has the matching adjoint in backward: identity <-> all-reduce,
split <-> all-gather, reduce-scatter <-> all-gather.
"""

from __future__ import annotations

from typing import Any

import torch

from nxd_core_parallel.parallel_layers import comm
from nxd_core_parallel.parallel_layers.comm import tp_group as _tp_group
from nxd_core_parallel.parallel_layers.comm import trivial as _trivial

# without model parallelism (a single process, or TP not set up) every mapping is the identity


class _Copy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        return comm.all_reduce(grad.clone(), ctx.group), None


class _Reduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        return comm.all_reduce(x.clone(), group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _Scatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, group):
        ctx.dim, ctx.group = dim, group
        return comm.split(x, dim, group)

    @staticmethod
    def backward(ctx, grad):
        return comm.all_gather(grad, ctx.dim, ctx.group), None, None


class _Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, group, backward_reduce_scatter):
        ctx.dim, ctx.group, ctx.rs = dim, group, backward_reduce_scatter
        return comm.all_gather(x, dim, group)

    @staticmethod
    def backward(ctx, grad):
        if ctx.rs:
            return comm.reduce_scatter(grad, ctx.dim, ctx.group), None, None, None
        return comm.split(grad, ctx.dim, ctx.group), None, None, None


class _ReduceScatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, group):
        ctx.dim, ctx.group = dim, group
        return comm.reduce_scatter(x, dim, group)

    @staticmethod
    def backward(ctx, grad):
        return comm.all_gather(grad, ctx.dim, ctx.group), None, None


def copy_to_tensor_model_parallel_region(x: torch.Tensor, process_group: Any = None) -> torch.Tensor:
    """Identity forward; all-reduce of the gradient over TP."""
    group = _tp_group(process_group)
    return x if _trivial(group) else _Copy.apply(x, group)


def reduce_from_tensor_model_parallel_region(x: torch.Tensor, process_group: Any = None) -> torch.Tensor:
    """All-reduce forward over TP; identity backward."""
    group = _tp_group(process_group)
    return x if _trivial(group) else _Reduce.apply(x, group)


def scatter_to_tensor_model_parallel_region(x: torch.Tensor, process_group: Any = None) -> torch.Tensor:
    """Keep this rank's slice of the last dimension; all-gather the gradient."""
    group = _tp_group(process_group)
    return x if _trivial(group) else _Scatter.apply(x, x.dim() - 1, group)


def gather_from_tensor_model_parallel_region(x: torch.Tensor, process_group: Any = None) -> torch.Tensor:
    """All-gather the last dimension; the gradient keeps this rank's slice."""
    group = _tp_group(process_group)
    return x if _trivial(group) else _Gather.apply(x, x.dim() - 1, group, False)


def scatter_to_sequence_parallel_region(x: torch.Tensor, sequence_dimension: int = 0, process_group: Any = None) -> torch.Tensor:
    """Keep this rank's slice of the sequence dimension; all-gather the gradient."""
    group = _tp_group(process_group)
    return x if _trivial(group) else _Scatter.apply(x, sequence_dimension, group)


def gather_from_sequence_parallel_region(
    x: torch.Tensor, sequence_dimension: int = 0, to_model_parallel: bool = True, process_group: Any = None
) -> torch.Tensor:
    """All-gather the sequence dimension. The gradient is reduce-scattered when the output feeds
    tensor-parallel compute (each rank holds a partial gradient), else split."""
    group = _tp_group(process_group)
    return x if _trivial(group) else _Gather.apply(x, sequence_dimension, group, to_model_parallel)


def reduce_scatter_to_sequence_parallel_region(
    x: torch.Tensor, sequence_dimension: int = 0, process_group: Any = None
) -> torch.Tensor:
    """Sum partial results over TP and keep this rank's sequence slice; all-gather the gradient."""
    group = _tp_group(process_group)
    return x if _trivial(group) else _ReduceScatter.apply(x, sequence_dimension, group)


class _ReduceGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return comm.all_reduce(grad.clone(), ctx.group), None


def reduce_grad_over_group(x: torch.Tensor, group: Any) -> torch.Tensor:
    """Identity forward; sum the gradient over ``group`` (replicated weights, e.g. GQA KV)."""
    return x if _trivial(group) else _ReduceGrad.apply(x, group)
