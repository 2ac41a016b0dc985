"""DeepSeek-V3 on real gloo ranks against one process running transformers on the same
micro-batches (loss, every gradient after nxd's gradient sync, global gradient norm): TP=2 with
sequence parallelism and full activation checkpointing (heads split, the replicated MLA down
projections and shared rotary key summed right), EP=2 (routed experts split, shared ones not)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from deepseek_test_utils import BUFFERS, SPEC, batch, save_hf  # noqa: E402

from nxd_testing.reference import assert_parallel_parity, hf_lm_reference, parallel_grads_body, quiet_transformers

quiet_transformers()


def test_deepseek_v3_tp2_sp_checkpointing_and_ep2(rank_pool, tmp_path):
    src = save_hf(tmp_path / "hf", seed=2)
    data = batch(seed=4, batch_size=4)
    pool = rank_pool(2)
    tp2 = pool.run(parallel_grads_body, 2, 1, *SPEC, str(src), data, True, True, BUFFERS, timeout=600)[0]
    ep2 = pool.run(parallel_grads_body, 1, 2, *SPEC, str(src), data, False, False, BUFFERS, timeout=600)[0]
    worst_tp = assert_parallel_parity(tp2, hf_lm_reference(src, data, 1))
    worst_ep = assert_parallel_parity(ep2, hf_lm_reference(src, data, 2))
    print(f"\ndeepseek_v3 TP=2 + SP + activation checkpointing: {worst_tp:.3g}; EP=2 (DP=2): {worst_ep:.3g}")
