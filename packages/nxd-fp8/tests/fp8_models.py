"""A tiny LM of nxd's TP layers whose shards are FP8-eligible (every dimension a multiple of 16 at
TP <= 2), its data, and the single-process oracle of a data-parallel run with FP8."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from nxd_core_parallel import parallel_state as ps
from nxd_core_parallel.modules.qkv_linear import GQAQKVColumnParallelLinear
from nxd_core_parallel.modules.rms_norm import RMSNorm
from nxd_core_parallel.parallel_layers import (
    ColumnParallelLinear,
    ParallelEmbedding,
    RowParallelLinear,
    parallel_cross_entropy,
)
from nxd_testing.reference import token_chain_batch

VOCAB, HID, HEADS, KV_HEADS, FFN = 64, 32, 2, 1, 64
BATCH, SEQ, LR = 8, 16, 1e-2


class Block(nn.Module):
    def __init__(self, sp: bool) -> None:
        super().__init__()
        tp = ps.get_tensor_model_parallel_size() if ps.model_parallel_is_initialized() else 1
        kw = {"sequence_parallel_enabled": sp, "sequence_dimension": 1}
        self.head_dim = HID // HEADS
        self.attn_norm = RMSNorm(HID, sequence_parallel_enabled=sp)
        self.qkv = GQAQKVColumnParallelLinear(HID, [HID, KV_HEADS * self.head_dim], bias=False, gather_output=False,
                                              kv_size_multiplier=max(tp // KV_HEADS, 1), **kw)
        self.o_proj = RowParallelLinear(HID, HID, bias=False, input_is_parallel=True, **kw)
        self.mlp_norm = RMSNorm(HID, sequence_parallel_enabled=sp)
        self.up = ColumnParallelLinear(HID, FFN, bias=False, gather_output=False, **kw)
        self.down = RowParallelLinear(FFN, HID, bias=False, input_is_parallel=True, **kw)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.attn_norm(h))
        b, s = q.shape[:2]
        q, k, v = (t.view(b, s, -1, self.head_dim).transpose(1, 2) for t in (q, k, v))
        k, v = (t.repeat_interleave(q.size(1) // t.size(1), dim=1) for t in (k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, -1)
        h = h + self.o_proj(a)
        return h + self.down(F.silu(self.up(self.mlp_norm(h))))


class TinyLM(nn.Module):
    nxd_transformer_layer_classes = (Block,)

    def __init__(self, sp: bool = False, layers: int = 2) -> None:
        super().__init__()
        kw = {"sequence_parallel_enabled": sp, "sequence_dimension": 1}
        self.embed = ParallelEmbedding(VOCAB, HID, **kw)
        self.layers = nn.ModuleList(Block(sp) for _ in range(layers))
        self.lm_head = ColumnParallelLinear(HID, VOCAB, bias=False, gather_output=False, **kw)

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        for layer in self.layers:
            h = layer(h)
        return parallel_cross_entropy(self.lm_head(h), labels).mean()


def build(sp: bool = False) -> TinyLM:
    torch.manual_seed(1234)  # the parallel layers initialise shards of the same full weights
    return TinyLM(sp)


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    return token_chain_batch(step, batch=BATCH, seq=SEQ, vocab=VOCAB, mult=5, add=3)


#: the blocks' linear layers: what FP8 converts (the head is kept in high precision)
FP8_LAYERS = [f"layers.{i}.{n}" for i in range(2) for n in ("qkv", "o_proj", "up", "down")]
