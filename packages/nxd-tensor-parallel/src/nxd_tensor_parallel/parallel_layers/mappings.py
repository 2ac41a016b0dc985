"""Autograd-aware collectives for tensor and sequence parallelism (Megatron/NxD semantics).

Each forward collective has the matching adjoint in backward: identity <-> all-reduce,
split <-> all-gather, reduce-scatter <-> all-gather.
"""

from __future__ import annotations

from typing import Any

import torch

from nxd_tensor_parallel.parallel_layers import comm
from nxd_tensor_parallel.parallel_layers.comm import tp_group as _tp_group
from nxd_tensor_parallel.parallel_layers.comm import trivial as _trivial

# without model parallelism (a single process, or TP not set up) every mapping is the identity


def _in_dtype(reduce: Any, t: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """``reduce(t)`` carried out in ``dtype`` (NxD's ``reduce_dtype``: bf16 partial sums added in
    fp32), the result back in ``t``'s dtype; ``None`` reduces in ``t``'s own dtype."""
    if dtype is None or dtype == t.dtype:
        return reduce(t)
    return reduce(t.to(dtype)).to(t.dtype)


class _Copy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, reduce_dtype):
        ctx.group, ctx.reduce_dtype = group, reduce_dtype
        return x

    @staticmethod
    def backward(ctx, grad):
        return _in_dtype(lambda g: comm.all_reduce(g.clone(), ctx.group), grad, ctx.reduce_dtype), None, None


class _Reduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, reduce_dtype):
        return _in_dtype(lambda t: comm.all_reduce(t.clone(), group), x, reduce_dtype)

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None


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
    def forward(ctx, x, dim, group, backward_reduce_scatter, reduce_dtype):
        ctx.dim, ctx.group, ctx.rs, ctx.reduce_dtype = dim, group, backward_reduce_scatter, reduce_dtype
        return comm.all_gather(x, dim, group)

    @staticmethod
    def backward(ctx, grad):
        if ctx.rs:
            reduced = _in_dtype(lambda g: comm.reduce_scatter(g, ctx.dim, ctx.group), grad, ctx.reduce_dtype)
            return reduced, None, None, None, None
        return comm.split(grad, ctx.dim, ctx.group), None, None, None, None


class _ReduceScatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, group, reduce_dtype):
        ctx.dim, ctx.group = dim, group
        return _in_dtype(lambda t: comm.reduce_scatter(t, dim, group), x, reduce_dtype)

    @staticmethod
    def backward(ctx, grad):
        return comm.all_gather(grad, ctx.dim, ctx.group), None, None, None


def copy_to_tensor_model_parallel_region(x: torch.Tensor, process_group: Any = None,
                                         reduce_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Identity forward; all-reduce of the gradient over TP (in ``reduce_dtype`` when given)."""
    group = _tp_group(process_group)
    return x if _trivial(group) else _Copy.apply(x, group, reduce_dtype)


def reduce_from_tensor_model_parallel_region(x: torch.Tensor, process_group: Any = None,
                                             reduce_dtype: torch.dtype | None = None) -> torch.Tensor:
    """All-reduce forward over TP (in ``reduce_dtype`` when given); identity backward."""
    group = _tp_group(process_group)
    return x if _trivial(group) else _Reduce.apply(x, group, reduce_dtype)


def scatter_to_tensor_model_parallel_region(x: torch.Tensor, process_group: Any = None) -> torch.Tensor:
    """Keep this rank's slice of the last dimension; all-gather the gradient."""
    group = _tp_group(process_group)
    return x if _trivial(group) else _Scatter.apply(x, x.dim() - 1, group)


def gather_from_tensor_model_parallel_region(x: torch.Tensor, process_group: Any = None) -> torch.Tensor:
    """All-gather the last dimension; the gradient keeps this rank's slice."""
    group = _tp_group(process_group)
    return x if _trivial(group) else _Gather.apply(x, x.dim() - 1, group, False, None)


def scatter_to_sequence_parallel_region(x: torch.Tensor, sequence_dimension: int = 0, process_group: Any = None) -> torch.Tensor:
    """Keep this rank's slice of the sequence dimension; all-gather the gradient."""
    group = _tp_group(process_group)
    return x if _trivial(group) else _Scatter.apply(x, sequence_dimension, group)


def gather_from_sequence_parallel_region(
    x: torch.Tensor, sequence_dimension: int = 0, to_model_parallel: bool = True, process_group: Any = None,
    reduce_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """All-gather the sequence dimension. The gradient is reduce-scattered (in ``reduce_dtype`` when
    given) when the output feeds tensor-parallel compute (each rank holds a partial gradient), else split."""
    group = _tp_group(process_group)
    return x if _trivial(group) else _Gather.apply(x, sequence_dimension, group, to_model_parallel, reduce_dtype)


def reduce_scatter_to_sequence_parallel_region(
    x: torch.Tensor, sequence_dimension: int = 0, process_group: Any = None, reduce_dtype: torch.dtype | None = None
) -> torch.Tensor:
    """Sum partial results over TP (in ``reduce_dtype`` when given) and keep this rank's sequence
    slice; all-gather the gradient."""
    group = _tp_group(process_group)
    return x if _trivial(group) else _ReduceScatter.apply(x, sequence_dimension, group, reduce_dtype)


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
