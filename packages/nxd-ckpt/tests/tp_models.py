"""Small models of nxd-core-parallel layers used by the multi-rank resharding tests.

Core-parallel layers initialise the full tensor from the global RNG and keep this rank's shard,
so the same seed gives the same full weights at every TP size: a model built with the seed at
the target TP size is the exact oracle for a resharded load.
"""

from __future__ import annotations

import torch

from nxd_core_parallel import parallel_state
from nxd_tensor_parallel.modules.qkv_linear import GQAQKVColumnParallelLinear
from nxd_tensor_parallel.modules.rms_norm import RMSNorm
from nxd_tensor_parallel.parallel_layers import ColumnParallelLinear, ParallelEmbedding, RowParallelLinear


class Block(torch.nn.Module):
    def __init__(self, hidden: int, kv_mult: int, fuse_qkv: bool) -> None:
        super().__init__()
        self.norm = RMSNorm(hidden)
        self.qkv = GQAQKVColumnParallelLinear(hidden, [hidden, hidden // 4], bias=True, kv_size_multiplier=kv_mult,
                                              fuse_qkv=fuse_qkv)
        self.up = ColumnParallelLinear(hidden, 4 * hidden, stride=2, bias=True, gather_output=False)
        self.down = RowParallelLinear(4 * hidden, hidden, bias=True, input_is_parallel=True)


class ShardedNet(torch.nn.Module):
    """Embedding + ``layers`` blocks + LM head. ``stage_layers`` keeps only some blocks (a PP
    stage) under their global names."""

    def __init__(self, layers: int = 2, stage_layers: list[int] | None = None, kv_mult: int | None = None,
                 fuse_qkv: bool = True) -> None:
        super().__init__()
        tp = parallel_state.get_tensor_model_parallel_size()
        kv_mult = tp if kv_mult is None else kv_mult  # one KV head piece, replicated over TP
        hidden = 8
        keep = set(range(layers) if stage_layers is None else stage_layers)
        # build everything so every stage draws the same random numbers, keep only this stage's part
        embed = ParallelEmbedding(16, hidden)
        blocks = {str(i): Block(hidden, kv_mult, fuse_qkv) for i in range(layers)}
        head = ColumnParallelLinear(hidden, 16, bias=False)
        self.embed = embed if 0 in keep else None
        self.layers = torch.nn.ModuleDict({k: v for k, v in blocks.items() if int(k) in keep})
        self.head = head if layers - 1 in keep else None


def build(tp: int, pp: int, seed: int, layers: int = 2, fuse_qkv: bool = True, kv_pieces: int | None = None) -> ShardedNet:
    """``kv_pieces``: cut K/V into this many pieces, each replicated on ``tp / kv_pieces`` ranks
    (None: one piece on every rank)."""
    parallel_state.initialize_model_parallel(tp, pp)
    torch.manual_seed(seed)
    if pp == 1:
        kv_mult = None if kv_pieces is None else max(tp // kv_pieces, 1)
        return ShardedNet(layers, fuse_qkv=fuse_qkv, kv_mult=kv_mult)
    stage = parallel_state.get_pipeline_model_parallel_rank()
    per = layers // pp
    return ShardedNet(layers, stage_layers=list(range(stage * per, (stage + 1) * per)), fuse_qkv=fuse_qkv)
