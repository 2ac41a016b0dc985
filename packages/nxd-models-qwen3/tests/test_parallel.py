"""Real gloo ranks against one process running transformers on the same micro-batches: loss, every
gradient after nxd's gradient sync (DP average, expert-DP reduction, SP all-reduce) and the global
gradient norm. Qwen3 at TP=2 (+SP, and with full activation checkpointing); Qwen3-MoE at EP=2 and
TP=2 + SP. The q/k head norms' weights see only their rank's heads: their gradient is summed over TP."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from qwen3_test_utils import batch, hf_reference, save_hf  # noqa: E402

from nxd_testing.reference import assert_parallel_parity as check
from nxd_testing.reference import parallel_grads_body, quiet_transformers

quiet_transformers()


DENSE = ("qwen3", "nxd_models_llama:collect_hf_state_dict")
MOE = ("qwen3_moe", "nxd_models_mixtral:collect_hf_state_dict")


def test_qwen3_tp2_sp_and_checkpointing(rank_pool, tmp_path):
    src = save_hf(tmp_path / "hf", tie_word_embeddings=True)
    data = batch(seed=3)
    ref = hf_reference(src, data)
    pool = rank_pool(2)
    worst = {(sp, ckpt): check(pool.run(parallel_grads_body, 2, 1, *DENSE, str(src), data, sp, ckpt, timeout=600)[0], ref)
             for sp, ckpt in ((False, False), (True, True))}
    print(f"\nqwen3 TP=2: {worst[(False, False)]:.3g}; TP=2 + SP + activation checkpointing: {worst[(True, True)]:.3g}")


def test_qwen3_moe_ep2_and_tp2_sp(rank_pool, tmp_path):
    src = save_hf(tmp_path / "hf", moe=True, seed=2)
    data = batch(seed=4, batch_size=4)
    pool = rank_pool(2)
    ep2 = check(pool.run(parallel_grads_body, 1, 2, *MOE, str(src), data, timeout=600)[0], hf_reference(src, data, 2))
    tp2 = check(pool.run(parallel_grads_body, 2, 1, *MOE, str(src), data, True, timeout=600)[0], hf_reference(src, data, 1))
    print(f"\nqwen3_moe EP=2 (DP=2): {ep2:.3g}; TP=2 + SP: {tp2:.3g}")
