"""The tiny TP LM (nxd_testing.tiny_tp_lm) at sizes whose shards are FP8-eligible (every dimension
a multiple of 16 at TP <= 2), and its data."""

from __future__ import annotations

import torch

from nxd_testing.reference import token_chain_batch
from nxd_testing.tiny_tp_lm import TinyDims, TinyLM

DIMS = TinyDims(vocab=64, hidden=32, heads=2, kv_heads=1, ffn=64, bias=False)
BATCH, SEQ, LR = 8, 16, 1e-2


def build(sp: bool = False) -> TinyLM:
    torch.manual_seed(1234)  # the parallel layers initialise shards of the same full weights
    return TinyLM(DIMS, sp)


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    return token_chain_batch(step, batch=BATCH, seq=SEQ, vocab=DIMS.vocab, mult=5, add=3)


#: the blocks' linear layers: what FP8 converts (the head is kept in high precision)
FP8_LAYERS = [f"layers.{i}.{n}" for i in range(2) for n in ("qkv", "o_proj", "up", "down")]
