"""One process against transformers: Qwen3 (untied and tied embeddings) and Qwen3-MoE (a dense
layer by mlp_only_layers, renormalised top-k) imported from transformers' random checkpoints give
the same logits, loss (with HF's aux loss) and every gradient, also with YaRN rope scaling (Qwen3's
long-context config); export reloads in transformers with the same logits, equal tensors and the
source's config.json fields; greedy generation equals transformers'."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from qwen3_test_utils import batch, build_from_hf, hf_reference, nxd_forward_backward, save_hf  # noqa: E402

from nxd_testing.reference import assert_export_roundtrip, assert_parity, quiet_transformers

quiet_transformers()

#: Qwen3's long-context recipe (its model cards: YaRN, factor 4 over the 32768 pretraining positions)
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
CASES = {"dense": dict(moe=False), "dense_tied": dict(moe=False, tie_word_embeddings=True),
         "dense_yarn": dict(moe=False, rope_scaling=dict(YARN), max_position_embeddings=131072),
         "moe": dict(moe=True), "moe_sparse_step2_unnormalised": dict(moe=True, decoder_sparse_step=2,
                                                                     mlp_only_layers=[], norm_topk_prob=False),
         "moe_yarn": dict(moe=True, rope_scaling=dict(YARN), max_position_embeddings=131072)}


@pytest.mark.parametrize("case", list(CASES))
def test_tp1_parity_logits_loss_grads(tmp_path, case):
    src = save_hf(tmp_path / "hf", **copy.deepcopy(CASES[case]))
    data = batch()
    worst = assert_parity(nxd_forward_backward(str(src), data), hf_reference(src, data))
    print(f"\nqwen3 {case} TP=1: worst relative error {worst:.3g}")


@pytest.mark.parametrize("case", ["dense", "moe_yarn"])
def test_export_roundtrip_and_generate(tmp_path, case):
    """The tensors and every config.json field (YaRN's rope_scaling too) survive the round trip."""
    src = save_hf(tmp_path / "hf", **copy.deepcopy(CASES[case]))
    spec, model = build_from_hf(str(src))
    assert_export_roundtrip(spec, model, src, tmp_path / "out", batch()["input_ids"][:, :5])
