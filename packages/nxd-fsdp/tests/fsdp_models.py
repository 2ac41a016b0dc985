"""The tiny model, data and oracles the FSDP tests share.

``TinyLM`` has two transformer blocks (each one FSDP unit) of nxd-core-parallel's layers with
every kind of parameter the FSDP side must handle: column/row-sharded weights, TP-replicated row
biases and RMSNorm weights (also under sequence parallelism), and a fused GQA QKV weight whose K/V
piece is replicated across TP ranks. Parallel layers initialise the full tensor from the global RNG
and keep their shard, so one seed gives the same full model at every TP size: one process at TP=1
is the oracle."""

from __future__ import annotations

import torch
import torch.distributed as dist
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

VOCAB, HID, HEADS, KV_HEADS, FFN = 32, 16, 4, 1, 24
BATCH, SEQ, LR, MAX_NORM = 8, 8, 3e-3, 0.5


class Block(nn.Module):
    def __init__(self, sp: bool) -> None:
        super().__init__()
        tp = ps.get_tensor_model_parallel_size() if ps.model_parallel_is_initialized() else 1
        kw = {"sequence_parallel_enabled": sp, "sequence_dimension": 1}
        self.head_dim = HID // HEADS
        self.attn_norm = RMSNorm(HID, sequence_parallel_enabled=sp)
        self.qkv = GQAQKVColumnParallelLinear(HID, [HID, KV_HEADS * self.head_dim], bias=False, gather_output=False,
                                              kv_size_multiplier=max(tp // KV_HEADS, 1), **kw)
        self.o_proj = RowParallelLinear(HID, HID, bias=True, input_is_parallel=True, **kw)
        self.mlp_norm = RMSNorm(HID, sequence_parallel_enabled=sp)
        self.up = ColumnParallelLinear(HID, FFN, bias=True, gather_output=False, **kw)
        self.down = RowParallelLinear(FFN, HID, bias=True, input_is_parallel=True, **kw)

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


def build(sp: bool = False, dtype: torch.dtype = torch.float32) -> TinyLM:
    torch.manual_seed(1234)  # the parallel layers initialise shards of the same full weights
    return TinyLM(sp).to(dtype)


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    return token_chain_batch(step, batch=BATCH, seq=SEQ, vocab=VOCAB, mult=5, add=3)


def full_params(model: nn.Module, tp_group=None) -> dict[str, torch.Tensor]:
    """Every parameter of ``model`` as the full (DP- and TP-gathered) tensor, by name; collective."""
    from nxd_ckpt.sharding import merge_shards, sharding_of

    state = model.state_dict()  # FSDP: DP-gathered, TP-local
    shardings = {n: sharding_of(p) for n, p in model.named_parameters()}
    out = {}
    for name, value in state.items():
        sh = shardings.get(name)
        if sh is not None and tp_group is not None and dist.get_world_size(tp_group) > 1:
            pieces = [torch.empty_like(value) for _ in range(dist.get_world_size(tp_group))]
            dist.all_gather(pieces, value.contiguous(), group=tp_group)
            value = merge_shards(pieces, sh)
        out[name] = value.detach().clone()
    return out


def params_rel(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> float:
    """max over parameters of max|got - want| / max|want|."""
    assert got.keys() == want.keys(), set(got) ^ set(want)
    return max(((got[k].double() - want[k].double()).abs().max() / want[k].double().abs().max()).item() for k in want)


def held_bytes(model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes of parameters, gradients and optimizer state (step counters left out) this rank holds:
    DTensors count their local shard."""
    from torch.distributed.tensor import DTensor

    def size(tensors) -> int:
        local = [t.to_local() if isinstance(t, DTensor) else t for t in tensors]
        return sum(t.numel() * t.element_size() for t in local)

    params = list(model.parameters())
    inner = getattr(opt, "optimizer", opt)
    state = [v for s in inner.state.values() for k, v in s.items() if torch.is_tensor(v) and k != "step"]
    return {"params": size(params), "grads": size(p.grad for p in params if p.grad is not None), "state": size(state)}


def unsharded_bytes() -> dict[str, int]:
    """The same for the whole model with AdamW in one process."""
    n = sum(p.numel() * p.element_size() for p in build().parameters())
    return {"params": n, "grads": n, "state": 2 * n}
