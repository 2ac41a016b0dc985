"""Megatron's interleaved fused QKV (:class:`~nxd_tensor_parallel.modules.plain.GroupedQKVLinear`)
sharded over TP with K/V heads replicated (NxD's ``kv_size_multiplier``), for head counts whose
query groups TP does not divide (3 KV heads at TP=2, one KV head at TP=4).

Each rank holds ``[its q heads; its KV piece's k heads; the same v heads]`` (the layout of
``GQAQKVColumnParallelLinear(fuse_qkv=True)``): the weight's ``fused_splits`` and
``kv_size_multiplier`` describe it as a fused ``[q; k; v]`` tensor, and ``qkv_interleave``
``(groups, q heads per group, head_dim)`` says the full tensor is that one in Megatron's interleaved
row order (so checkpoints hold the one-device model's tensor and reshard to any TP). Replicas'
gradients are summed over the ranks sharing a KV piece, so they stay identical.
"""

from __future__ import annotations

import torch

from nxd.parallel import ParallelContext, dim_rank, dim_size, resolve_context
from nxd_tensor_parallel.modules.kv_heads import interleaved_to_fused, local_fused_rows
from nxd_tensor_parallel.parallel_layers.layers import (
    ColumnParallelLinear,
    InitMethod,
    default_linear_init,
    init_sharded_,
)
from nxd_tensor_parallel.parallel_layers.mappings import reduce_grad_over_group


def _no_init(weight: torch.Tensor) -> None:
    """The base class's sharded init is replaced by :meth:`GroupedQKVColumnParallelLinear.reset_parameters`."""


class GroupedQKVColumnParallelLinear(ColumnParallelLinear):
    """Column-parallel interleaved QKV with K/V replicated ``kv_size_multiplier`` times over TP."""

    def __init__(self, input_size: int, num_heads: int, num_kv_heads: int, head_dim: int, kv_size_multiplier: int,
                 bias: bool = True, dtype: torch.dtype = torch.float32, device: torch.device | str | None = None,
                 init_method: InitMethod | None = None, sequence_parallel_enabled: bool = False,
                 sequence_dimension: int | None = None, context: ParallelContext | None = None,
                 reduce_dtype: torch.dtype = torch.float32) -> None:
        context = resolve_context(context)
        tp, rank, m = dim_size(context, "tp"), dim_rank(context, "tp"), int(kv_size_multiplier)
        if m < 2 or tp % m or (num_kv_heads * m) % tp or num_heads % tp:
            raise ValueError(f"GroupedQKVColumnParallelLinear: kv_size_multiplier={m} must be > 1 and divide "
                             f"tensor_parallel_size={tp}, with num_kv_heads x multiplier ({num_kv_heads} x {m}) and "
                             f"num_heads ({num_heads}) divisible by it")
        self.num_heads, self.num_kv_heads, self.head_dim, self.kv_size_multiplier = num_heads, num_kv_heads, head_dim, m
        self.q_local, self.kv_local = num_heads // tp * head_dim, num_kv_heads * m // tp * head_dim
        order = interleaved_to_fused(num_kv_heads, num_heads // num_kv_heads, head_dim)
        #: this rank's rows of the full (interleaved) weight, in local order
        self.local_rows = order[local_fused_rows(num_heads, num_kv_heads, head_dim, tp, rank, m)]
        super().__init__(input_size, tp * (self.q_local + 2 * self.kv_local), bias=bias, gather_output=False,
                         dtype=dtype, device=device, init_method=_no_init,
                         sequence_parallel_enabled=sequence_parallel_enabled, sequence_dimension=sequence_dimension,
                         context=context, reduce_dtype=reduce_dtype)
        self.output_size = len(order)  # the real (one-device) row count
        self.init_method = init_method or default_linear_init
        splits = (self.q_local, self.kv_local, self.kv_local)
        for param in (self.weight, self.bias):
            if param is not None:
                param.fused_splits, param.kv_size_multiplier = splits, m
                param.qkv_interleave = (num_kv_heads, num_heads // num_kv_heads, head_dim)
        self.reset_parameters()

    def local_of(self, full: torch.Tensor) -> torch.Tensor:
        """This rank's rows of a full (one-device, interleaved) weight or bias."""
        return full.index_select(0, self.local_rows.to(full.device))

    def reset_parameters(self) -> None:
        """This rank's rows of the one-device init (``init_method`` on the whole weight)."""
        if not hasattr(self, "kv_size_multiplier") or self.weight.is_meta or self.init_method is _no_init:
            return
        full = torch.empty(self.output_size, self.input_size, dtype=self.weight.dtype)
        init_sharded_(full, tuple(full.shape), 0, 1, self.init_method, 0, 1)
        with torch.no_grad():
            self.weight.copy_(self.local_of(full))
            if self.bias is not None:
                self.bias.zero_()

    def local_linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        group = self.parallel_context.kv_shared_dim(self.kv_size_multiplier).group
        weight = torch.cat([weight[: self.q_local], reduce_grad_over_group(weight[self.q_local:], group)])
        if bias is not None:
            bias = torch.cat([bias[: self.q_local], reduce_grad_over_group(bias[self.q_local:], group)])
        return super().local_linear(x, weight, bias)

    def extra_repr(self) -> str:
        return (f"in={self.input_size}, heads={self.num_heads}, kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, "
                f"kv_size_multiplier={self.kv_size_multiplier}, sequence_parallel={self.sequence_parallel_enabled}")
