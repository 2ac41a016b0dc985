"""Qwen3 and Qwen3-MoE under nxd-pipeline on real gloo ranks (1F1B) against the same weights at PP=1
in one process (gradient accumulation over the same micro-batches): loss and every gradient within
1e-5 relative (fp32). Qwen3 at PP=2 (DP=1, 2 ranks); Qwen3-MoE (HF's aux loss, a dense layer) at
PP=2 x EP=2 (DP=2, 4 ranks, slow)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from qwen3_test_utils import batch, save_hf  # noqa: E402

from nxd_testing.pipeline_reference import assert_pipeline_parity, pipeline_grads_body
from nxd_testing.reference import quiet_transformers

quiet_transformers()


def micro_batches(count: int) -> list[dict]:
    return [batch(seed=10 + i) for i in range(count)]


def test_qwen3_pp2_matches_pp1(rank_pool, tmp_path):
    src = save_hf(tmp_path / "hf", tie_word_embeddings=False)
    loss, grad = assert_pipeline_parity(rank_pool(2).run(pipeline_grads_body, "qwen3", str(src), micro_batches(2),
                                                         timeout=600))
    print(f"\nqwen3 PP=2 1f1b vs PP=1: loss rel {loss:.2e}, grads rel {grad:.2e}")


@pytest.mark.slow  # 4 ranks
def test_qwen3_moe_pp2_ep2_matches_pp1(rank_pool, tmp_path):
    src = save_hf(tmp_path / "hf", moe=True, seed=2, num_hidden_layers=2, mlp_only_layers=[0])
    loss, grad = assert_pipeline_parity(rank_pool(4).run(pipeline_grads_body, "qwen3_moe", str(src), micro_batches(4),
                                                         2, 2, timeout=600))
    print(f"\nqwen3_moe PP=2 x EP=2 (DP=2) vs PP=1: loss rel {loss:.2e}, grads rel {grad:.2e}")
