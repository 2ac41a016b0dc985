"""GQA QKV projection sharded over TP, with KV-head replication (``kv_size_multiplier``).

With ``m = kv_size_multiplier`` the real K/V weight is cut into ``tp / m`` pieces and each piece
is replicated on ``m`` neighbouring TP ranks (Megatron's layout): TP rank ``r`` holds piece
``r // m``, so TP may exceed the number of KV heads. With query heads sharded contiguously, the
query heads of rank ``r`` are exactly the ones that attend to its KV piece, so no head reordering
is needed anywhere (HF import/export, resharding, LoRA). The real (checkpoint) tensor is the
concatenation of the pieces of TP ranks ``0, m, 2m, ...``. Replicas' gradients are summed over the
ranks that share a piece (the context's ``kv_shared[m]`` group), so they stay identical.

Parameter names follow NxD: fused ``weight_qkv``/``bias_qkv`` (local rows = [q | k | v], recorded
in the ``fused_splits`` attribute), or ``weight_q``/``weight_k``/``weight_v`` (+ biases).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

import torch
from torch import nn

from nxd.parallel import ParallelContext, dim_group, dim_rank, dim_size, resolve_context
from nxd_tensor_parallel.parallel_layers.layers import (
    InitMethod,
    LocalLinear,
    column_parallel_input,
    default_linear_init,
    shard_of,
)
from nxd_tensor_parallel.parallel_layers.mappings import (
    gather_from_tensor_model_parallel_region,
    reduce_grad_over_group,
)
from nxd_tensor_parallel.parallel_layers.utils import divide, set_tensor_model_parallel_attributes


class GQAQKVColumnParallelLinear(LocalLinear, nn.Module):
    """Projects ``x`` to ``(q, k, v)``; ``output_sizes = [q_size, kv_size]`` (total, unsharded)."""

    def __init__(
        self,
        input_size: int,
        output_sizes: Sequence[int],
        bias: bool = True,
        gather_output: bool = True,
        dtype: torch.dtype = torch.float32,
        device: Optional[torch.device] = None,
        init_method: Optional[InitMethod] = None,
        sequence_parallel_enabled: bool = False,
        sequence_dimension: int = 0,
        kv_size_multiplier: int = 1,
        fuse_qkv: bool = True,
        context: ParallelContext | None = None,
        reduce_dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        if len(output_sizes) != 2:
            raise ValueError(f"output_sizes must be [q_size, kv_size], got {list(output_sizes)}")
        # NxD-style construction (no context=) builds for the current context: the one fallback
        self.parallel_context = resolve_context(context)
        tp, rank = dim_size(self.parallel_context, "tp"), dim_rank(self.parallel_context, "tp")
        m = int(kv_size_multiplier)
        if m < 1 or tp % m:
            raise ValueError(f"kv_size_multiplier={kv_size_multiplier} must be >= 1 and divide "
                             f"tensor_model_parallel_size={tp}")
        if sequence_parallel_enabled and gather_output:
            raise ValueError("GQAQKVColumnParallelLinear: sequence_parallel_enabled=True needs gather_output=False")
        self.input_size = input_size
        self.q_size, self.kv_size = int(output_sizes[0]), int(output_sizes[1])
        self.kv_size_multiplier, self.fuse_qkv, self.gather_output = m, fuse_qkv, gather_output
        self.sequence_parallel_enabled, self.sequence_dimension = sequence_parallel_enabled, sequence_dimension
        self.reduce_dtype = reduce_dtype  # NxD's: the input gradient's TP sum is carried out in this dtype
        self.init_method = init_method or default_linear_init
        self.q_local = divide(self.q_size, tp, "GQAQKVColumnParallelLinear q_size")
        self.kv_unique_ranks = tp // m
        self.kv_local = divide(self.kv_size, self.kv_unique_ranks, f"kv_size x kv_size_multiplier ({self.kv_size} x {m})")
        self.kv_piece = rank // m  # replicas of a piece sit on m neighbouring ranks
        factory = {"dtype": dtype, "device": device}
        splits = (self.q_local, self.kv_local, self.kv_local)
        if fuse_qkv:
            self.weight_qkv = nn.Parameter(torch.empty(sum(splits), input_size, **factory))
            self._tag(self.weight_qkv, splits)
            self.bias_qkv = nn.Parameter(torch.empty(sum(splits), **factory)) if bias else None
            if bias:
                self._tag(self.bias_qkv, splits)
        else:
            for name, rows in zip("qkv", splits):
                w = nn.Parameter(torch.empty(rows, input_size, **factory))
                self._tag(w, None, kv=name != "q")
                setattr(self, f"weight_{name}", w)
                b = nn.Parameter(torch.empty(rows, **factory)) if bias else None
                if b is not None:
                    self._tag(b, None, kv=name != "q")
                setattr(self, f"bias_{name}", b)
        self.reset_parameters()

    def _tag(self, param: torch.Tensor, splits: tuple[int, ...] | None, kv: bool = False) -> None:
        set_tensor_model_parallel_attributes(param, True, 0, 1)
        if splits is not None:
            param.fused_splits = splits
        if self.kv_size_multiplier > 1 and (kv or splits is not None):
            # For a fused parameter this applies to the K and V pieces only.
            param.kv_size_multiplier = self.kv_size_multiplier

    def local_pieces(self, masters: list[torch.Tensor]) -> list[torch.Tensor]:
        """This rank's q, k and v rows of the full (one-device) ``masters`` = ``[q, k, v]``."""
        tp, rank = dim_size(self.parallel_context, "tp"), dim_rank(self.parallel_context, "tp")
        q = shard_of(masters[0], 0, 1, rank, tp)
        k, v = (shard_of(t, 0, 1, self.kv_piece, self.kv_unique_ranks) for t in masters[1:])
        return [q, k, v]

    def reset_parameters(self) -> None:
        weights = [self.weight_qkv] if self.fuse_qkv else [self.weight_q, self.weight_k, self.weight_v]
        if weights[0].is_meta:
            return
        masters = [torch.empty(rows, self.input_size) for rows in (self.q_size, self.kv_size, self.kv_size)]
        for t in masters:
            self.init_method(t)
        local = self.local_pieces(masters)
        with torch.no_grad():
            if self.fuse_qkv:
                self.weight_qkv.copy_(torch.cat(local))
                if self.bias_qkv is not None:
                    self.bias_qkv.zero_()
            else:
                for name, piece in zip("qkv", local):
                    getattr(self, f"weight_{name}").copy_(piece)
                    b = getattr(self, f"bias_{name}")
                    if b is not None:
                        b.zero_()

    def _weights_and_biases(self) -> tuple[list[torch.Tensor], list[Optional[torch.Tensor]]]:
        if self.fuse_qkv:
            splits = [self.q_local, self.kv_local, self.kv_local]
            ws = list(torch.split(self.weight_qkv, splits, dim=0))
            bs = list(torch.split(self.bias_qkv, splits, dim=0)) if self.bias_qkv is not None else [None] * 3
        else:
            ws = [self.weight_q, self.weight_k, self.weight_v]
            bs = [self.bias_q, self.bias_k, self.bias_v]
        if self.kv_size_multiplier > 1:
            group = self.parallel_context.kv_shared_dim(self.kv_size_multiplier).group
            ws[1:] = [reduce_grad_over_group(w, group) for w in ws[1:]]
            bs[1:] = [b if b is None else reduce_grad_over_group(b, group) for b in bs[1:]]
        return ws, bs

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        group = dim_group(self.parallel_context, "tp")
        x = column_parallel_input(x, self, group, self.reduce_dtype)
        if self.fuse_qkv and self.kv_size_multiplier == 1:
            out = self.local_linear(x, self.weight_qkv, self.bias_qkv)
            q, k, v = torch.split(out, [self.q_local, self.kv_local, self.kv_local], dim=-1)
        else:
            ws, bs = self._weights_and_biases()
            q, k, v = (self.local_linear(x, w, b) for w, b in zip(ws, bs))
        if self.gather_output:
            q = gather_from_tensor_model_parallel_region(q, process_group=group)
            k = self.unique_kv(gather_from_tensor_model_parallel_region(k, process_group=group))
            v = self.unique_kv(gather_from_tensor_model_parallel_region(v, process_group=group))
        return q, k, v

    def unique_kv(self, gathered: torch.Tensor) -> torch.Tensor:
        """The real K or V output from the TP-gathered one (last dim ``tp * kv_local``): with
        replication the gather holds each piece ``m`` times in a row; keep the first copy of each."""
        if self.kv_size_multiplier == 1:
            return gathered
        per_rank = gathered.unflatten(-1, (-1, self.kv_size_multiplier, self.kv_local))
        return per_rank.select(-2, 0).flatten(-2)

    def extra_repr(self) -> str:
        return (f"in={self.input_size}, q={self.q_size}, kv={self.kv_size}, kv_size_multiplier={self.kv_size_multiplier}, "
                f"fuse_qkv={self.fuse_qkv}, sequence_parallel={self.sequence_parallel_enabled}")
