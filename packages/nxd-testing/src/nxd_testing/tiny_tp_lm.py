"""A tiny transformer LM built from nxd-tensor-parallel's TP layers, for parity tests of what wraps a
model (FSDP, FP8, ...): column/row-sharded weights, TP-replicated row biases and RMSNorm weights
(also under sequence parallelism), and a fused GQA QKV weight whose K/V piece is replicated across TP
ranks. The parallel layers initialise the full tensor from the global RNG and keep their shard, so
one seed gives the same full model at every TP size (one process at TP=1 is the oracle).
Needs nxd-tensor-parallel (imported here only)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from nxd.parallel import ParallelContext, dim_size, resolve_context
from nxd_tensor_parallel.modules.qkv_linear import GQAQKVColumnParallelLinear
from nxd_tensor_parallel.modules.rms_norm import RMSNorm
from nxd_tensor_parallel.parallel_layers import (
    ColumnParallelLinear,
    ParallelEmbedding,
    RowParallelLinear,
    parallel_cross_entropy,
)


@dataclass(frozen=True)
class TinyDims:
    vocab: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    #: biases on the attention output and MLP projections (TP-replicated row biases)
    bias: bool = True


class Block(nn.Module):
    def __init__(self, sp: bool, dims: TinyDims, context: ParallelContext | None = None) -> None:
        super().__init__()
        tp = dim_size(context, "tp")
        kw = {"sequence_parallel_enabled": sp, "sequence_dimension": 1, "context": context}
        hid = dims.hidden
        self.head_dim = hid // dims.heads
        self.attn_norm = RMSNorm(hid, sequence_parallel_enabled=sp)
        self.qkv = GQAQKVColumnParallelLinear(hid, [hid, dims.kv_heads * self.head_dim], bias=False,
                                              gather_output=False, kv_size_multiplier=max(tp // dims.kv_heads, 1), **kw)
        self.o_proj = RowParallelLinear(hid, hid, bias=dims.bias, input_is_parallel=True, **kw)
        self.mlp_norm = RMSNorm(hid, sequence_parallel_enabled=sp)
        self.up = ColumnParallelLinear(hid, dims.ffn, bias=dims.bias, gather_output=False, **kw)
        self.down = RowParallelLinear(dims.ffn, hid, bias=dims.bias, input_is_parallel=True, **kw)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.attn_norm(h))
        b, s = q.shape[:2]
        q, k, v = (t.view(b, s, -1, self.head_dim).transpose(1, 2) for t in (q, k, v))
        k, v = (t.repeat_interleave(q.size(1) // t.size(1), dim=1) for t in (k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, -1)
        h = h + self.o_proj(a)
        return h + self.down(F.silu(self.up(self.mlp_norm(h))))


class TinyLM(nn.Module):
    """``forward(ids, labels)`` -> the mean token loss."""

    nxd_transformer_layer_classes = (Block,)

    def __init__(self, dims: TinyDims, sp: bool = False, layers: int = 2, context: ParallelContext | None = None) -> None:
        """``context``: the parallel context to build for (the current one when left out, as NxD-style
        model code does); every layer takes it from here."""
        super().__init__()
        context = resolve_context(context)
        kw = {"sequence_parallel_enabled": sp, "sequence_dimension": 1, "context": context}
        self.embed = ParallelEmbedding(dims.vocab, dims.hidden, **kw)
        self.layers = nn.ModuleList(Block(sp, dims, context) for _ in range(layers))
        self.lm_head = ColumnParallelLinear(dims.hidden, dims.vocab, bias=False, gather_output=False, **kw)

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        for layer in self.layers:
            h = layer(h)
        return parallel_cross_entropy(self.lm_head(h), labels).mean()
