"""ZeRO-1 with TP=2 x DP=2 (4 ranks) through the NxD API, against one process with torch AdamW.

The model (nxd_testing.tiny_tp_lm, one block) uses nxd-core-parallel's layers with every kind of parameter the grad norm must count
exactly once: column/row-sharded weights, TP-replicated row biases and RMSNorm weights (also under
sequence parallelism, so their grads need the SP all-reduce), and a fused GQA QKV weight whose K/V
piece is replicated across TP ranks (kv_size_multiplier=2)."""

from __future__ import annotations

import pytest
import torch

import nxd
from nxd_core_parallel import parallel_state as ps
from nxd_testing.reference import max_rel, token_chain_batch, train_data_parallel, train_reference
from nxd_testing.tiny_tp_lm import TinyDims, TinyLM

VOCAB, HID, HEADS, KV_HEADS, FFN = 32, 16, 4, 1, 24
DIMS = TinyDims(vocab=VOCAB, hidden=HID, heads=HEADS, kv_heads=KV_HEADS, ffn=FFN)
BATCH, SEQ, STEPS, LR, MAX_NORM = 4, 8, 20, 3e-3, 1.0


def build(sp: bool) -> TinyLM:
    torch.manual_seed(1234)  # the parallel layers initialise shards of the same full weights
    return TinyLM(DIMS, sp, layers=1)


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    # Learnable data: each next token is (5 * token + 3) mod VOCAB, from a random start.
    return token_chain_batch(step, batch=BATCH, seq=SEQ, vocab=VOCAB, mult=5, add=3)


def reference() -> tuple[list[float], list[float]]:
    model = build(False)
    run = train_reference(model, torch.optim.AdamW(model.parameters(), lr=LR), (batch(s) for s in range(STEPS)),
                          max_norm=MAX_NORM)
    return run.losses, run.grad_norms


def zero1_body() -> tuple[list[float], list[float], str]:
    cfg = nxd.neuronx_distributed_config(
        tensor_parallel_size=2, sequence_parallel=True,
        optimizer_config={"zero_one_enabled": True, "grad_clipping": True, "max_grad_norm": MAX_NORM},
    )
    model = nxd.initialize_parallel_model(cfg, build, False, True)
    opt = nxd.initialize_parallel_optimizer(cfg, torch.optim.AdamW, model.parameters(), lr=LR)
    run = train_data_parallel(model, opt, (batch(s) for s in range(STEPS)), group=ps.get_data_parallel_group())
    return run.losses, run.grad_norms, type(opt).__name__


@pytest.mark.slow
def test_zero1_tp2_dp2_sp_matches_single_process(rank_pool):
    ref_losses, ref_norms = reference()
    assert ref_losses[-1] < ref_losses[0] - 0.1 and max(ref_norms) > MAX_NORM  # learns, and clipping acts
    for losses, norms, name in rank_pool(4).run(zero1_body):
        assert name == "NeuronZero1Optimizer"
        worst_loss, worst_norm = max_rel(losses, ref_losses), max_rel(norms, ref_norms)
        print(f"ZeRO-1 TP=2 DP=2 SP: max rel diff loss {worst_loss:.2e}, grad norm {worst_norm:.2e}")
        assert worst_loss < 1e-5 and worst_norm < 1e-5
