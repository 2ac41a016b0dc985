"""A small transformer built from the parallel layers, trained 20 steps through the NxD API
(neuronx_distributed_config / initialize_parallel_model / initialize_parallel_optimizer) at
TP=2+SP, DP=2 and TP=2xDP=2, against the same model trained by one process with plain torch
(torch AdamW, torch.nn.utils.clip_grad_norm_) on the same data."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import nxd
from nxd_core_parallel import parallel_state as ps
from nxd_tensor_parallel.modules.qkv_linear import GQAQKVColumnParallelLinear
from nxd_tensor_parallel.modules.rms_norm import RMSNorm
from nxd_tensor_parallel.parallel_layers import (
    ColumnParallelLinear,
    ParallelEmbedding,
    RowParallelLinear,
    parallel_cross_entropy,
)
from nxd_testing.reference import max_rel, token_chain_batch, train_data_parallel, train_reference

VOCAB, HID, HEADS, KV_HEADS, FFN, LAYERS = 32, 16, 4, 1, 32, 2
BATCH, SEQ, STEPS, LR, MAX_NORM = 4, 8, 20, 3e-3, 1.0
TOL = 1e-5


class Block(nn.Module):
    def __init__(self, sp: bool) -> None:
        super().__init__()
        tp = ps.get_tensor_model_parallel_size()
        self.head_dim = HID // HEADS
        kv_mult = tp // KV_HEADS if KV_HEADS < tp else 1
        kw = {"sequence_parallel_enabled": sp, "sequence_dimension": 1}
        self.attn_norm = RMSNorm(HID, sequence_parallel_enabled=sp)
        self.qkv = GQAQKVColumnParallelLinear(HID, [HEADS * self.head_dim, KV_HEADS * self.head_dim], bias=False,
                                              gather_output=False, kv_size_multiplier=kv_mult, **kw)
        self.o_proj = RowParallelLinear(HID, HID, bias=False, input_is_parallel=True, **kw)
        self.mlp_norm = RMSNorm(HID, sequence_parallel_enabled=sp)
        self.up = ColumnParallelLinear(HID, FFN, bias=True, gather_output=False, **kw)
        self.down = RowParallelLinear(FFN, HID, bias=True, input_is_parallel=True, **kw)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.attn_norm(h))
        b, s = q.shape[:2]
        q, k, v = (t.view(b, s, -1, self.head_dim).transpose(1, 2) for t in (q, k, v))
        k = k.repeat_interleave(q.size(1) // k.size(1), dim=1)
        v = v.repeat_interleave(q.size(1) // v.size(1), dim=1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, -1)
        h = h + self.o_proj(a)
        return h + self.down(F.silu(self.up(self.mlp_norm(h))))


class TinyLM(nn.Module):
    nxd_transformer_layer_classes = (Block,)

    def __init__(self, sp: bool = False) -> None:
        super().__init__()
        kw = {"sequence_parallel_enabled": sp, "sequence_dimension": 1}
        self.embed = ParallelEmbedding(VOCAB, HID, **kw)
        self.layers = nn.ModuleList(Block(sp) for _ in range(LAYERS))
        self.norm = RMSNorm(HID, sequence_parallel_enabled=sp)
        self.lm_head = ColumnParallelLinear(HID, VOCAB, bias=False, gather_output=False, **kw)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer(h)
        return parallel_cross_entropy(self.lm_head(self.norm(h)), labels).mean()


def build(sp: bool) -> TinyLM:
    torch.manual_seed(1234)
    return TinyLM(sp)


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    # Learnable data: each next token is (3 * token + 1) mod VOCAB, from a random start.
    return token_chain_batch(step, batch=BATCH, seq=SEQ, vocab=VOCAB, mult=3, add=1)


def reference_losses() -> tuple[list[float], list[float]]:
    """One process, no parallel state: the same model and data with plain torch training."""
    model = build(False)
    run = train_reference(model, torch.optim.AdamW(model.parameters(), lr=LR), (batch(s) for s in range(STEPS)),
                          max_norm=MAX_NORM)
    return run.losses, run.grad_norms


def train_body(tp: int, sp: bool, checkpointing: str | None) -> tuple[list[float], list[float]]:
    cfg = nxd.neuronx_distributed_config(
        tensor_parallel_size=tp, sequence_parallel=sp, activation_checkpoint_config=checkpointing,
        optimizer_config={"zero_one_enabled": False, "grad_clipping": True, "max_grad_norm": MAX_NORM},
    )
    model = nxd.initialize_parallel_model(cfg, build, False, sp)
    opt = nxd.initialize_parallel_optimizer(cfg, torch.optim.AdamW, model.parameters(), lr=LR)
    run = train_data_parallel(model, opt, (batch(s) for s in range(STEPS)), group=ps.get_data_parallel_group())
    return run.losses, run.grad_norms


@pytest.fixture(scope="module")
def reference() -> tuple[list[float], list[float]]:
    losses, norms = reference_losses()
    assert losses[-1] < losses[0] - 0.1, f"the reference must learn: {losses[0]} -> {losses[-1]}"
    assert max(norms) > MAX_NORM, "clipping must be exercised"
    return losses, norms


@pytest.mark.slow
@pytest.mark.parametrize("tp,sp,checkpointing", [(2, True, None), (2, True, "full"), (2, True, "op"), (1, False, None), (2, False, None)],
                         ids=["tp2-sp", "tp2-sp-actckpt", "tp2-sp-op-actckpt", "dp2", "tp2"])
def test_training_matches_single_process_2_ranks(rank_pool, reference, tp, sp, checkpointing):
    for losses, norms in rank_pool(2).run(train_body, tp, sp, checkpointing):
        worst, worst_norm = max_rel(losses, reference[0]), max_rel(norms, reference[1])
        print(f"tp={tp} sp={sp} ckpt={checkpointing}: max loss rel diff {worst:.2e}, grad-norm {worst_norm:.2e}")
        assert worst < TOL and worst_norm < TOL


@pytest.mark.slow
@pytest.mark.four_ranks
def test_training_matches_single_process_tp2_dp2(rank_pool, reference):
    for losses, norms in rank_pool(4).run(train_body, 2, True, None):
        worst, worst_norm = max_rel(losses, reference[0]), max_rel(norms, reference[1])
        print(f"tp=2 dp=2 sp: max loss rel diff {worst:.2e}, grad-norm {worst_norm:.2e}")
        assert worst < TOL and worst_norm < TOL
