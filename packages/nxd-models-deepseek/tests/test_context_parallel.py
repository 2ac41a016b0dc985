"""DeepSeek-V3's multi-head latent attention under context parallelism on real gloo ranks, against
transformers' DeepseekV3ForCausalLM on the whole batch in one process: loss, every gradient after
nxd's gradient sync and the global gradient norm within 1e-5 relative (fp32; the ring merges fp32
blocks through their log-sum-exp, the same arithmetic as one softmax up to rounding).

CP=2: each rank holds two chunks of every sequence; ring attention carries the keys
``[k_nope | k_rope]`` (20 wide) and the values (10 wide) around the ring, and the decoupled RoPE
rotates each chunk at its global positions. CP=2 x EP=2: the same two ranks also split the routed
experts (tokens of both CP ranks reach every expert through the all-to-all). The sequence-wise
balance loss and multi-token prediction under CP are refused by name."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from deepseek_test_utils import BUFFERS, SPEC, batch, build_tiny_under_cp, save_hf  # noqa: E402

from nxd_testing.reference import assert_parallel_parity, hf_lm_reference, parallel_grads_body, quiet_transformers

quiet_transformers()


def test_deepseek_v3_mla_cp2_and_cp2_ep2_match_one_process(rank_pool, tmp_path):
    src = save_hf(tmp_path / "hf", seed=3)
    data = batch(seed=5)
    ref = hf_lm_reference(src, data, 1)
    pool = rank_pool(2)
    cp2 = pool.run(parallel_grads_body, 1, 1, *SPEC, str(src), data, False, False, BUFFERS, 2, timeout=600)[0]
    cp2_ep2 = pool.run(parallel_grads_body, 1, 2, *SPEC, str(src), data, False, False, BUFFERS, 2, timeout=600)[0]
    worst, worst_ep = assert_parallel_parity(cp2, ref), assert_parallel_parity(cp2_ep2, ref)
    print(f"\ndeepseek_v3 MLA CP=2: worst relative error {worst:.3g}; CP=2 x EP=2: {worst_ep:.3g}")


@pytest.mark.parametrize("overrides, refusal", [
    ({"seq_aux_loss_coef": 0.001}, "seq_aux_loss_coef > 0 is not implemented under context parallelism"),
    ({"mtp_depth": 1}, "mtp_depth=1 is not implemented under context parallelism"),
], ids=["seq_aux_loss", "mtp"])
def test_cp_refusals_name_the_field(rank_pool, overrides, refusal):
    from nxd_testing.ranks import RankError

    with pytest.raises(RankError, match=refusal):
        rank_pool(2).run(build_tiny_under_cp, **overrides, timeout=120)
