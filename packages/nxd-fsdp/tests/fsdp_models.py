"""The tiny model, data and oracles the FSDP tests share.

``TinyLM`` (nxd_testing.tiny_tp_lm) has two transformer blocks (each one FSDP unit) of
nxd-core-parallel's layers with every kind of parameter the FSDP side must handle: column/row-sharded
weights, TP-replicated row biases and RMSNorm weights (also under sequence parallelism), and a fused
GQA QKV weight whose K/V piece is replicated across TP ranks. One seed gives the same full model at
every TP size: one process at TP=1 is the oracle."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from nxd_testing.reference import token_chain_batch
from nxd_testing.tiny_tp_lm import Block, TinyDims, TinyLM

DIMS = TinyDims(vocab=32, hidden=16, heads=4, kv_heads=1, ffn=24, bias=True)
VOCAB = DIMS.vocab
BATCH, SEQ, LR, MAX_NORM = 8, 8, 3e-3, 0.5
__all__ = ["Block", "TinyLM"]  # the FSDP units (tests name Block for activation checkpointing)


def build(sp: bool = False, dtype: torch.dtype = torch.float32) -> TinyLM:
    torch.manual_seed(1234)  # the parallel layers initialise shards of the same full weights
    return TinyLM(DIMS, sp).to(dtype)


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
