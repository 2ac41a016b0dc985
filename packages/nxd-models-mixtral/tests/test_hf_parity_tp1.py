"""One process: Mixtral imported from transformers' checkpoint gives the same logits, loss (with the
router aux loss) and gradients (also with a sliding window shorter than the sequence and YaRN rope
scaling); export round-trips (tensors and config.json fields); greedy generation equals transformers'."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from mixtral_test_utils import batch, compare, hf_reference, nxd_forward_backward, quiet_transformers, save_hf  # noqa: E402

from nxd_testing.reference import assert_export_roundtrip, build_from_hf  # noqa: E402

quiet_transformers()

#: head_dim given: transformers' YaRN reads config.head_dim, which MixtralConfig leaves None otherwise
WINDOW_YARN = {"sliding_window": 5, "head_dim": 8, "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                                     "original_max_position_embeddings": 64}}


@pytest.mark.parametrize("overrides", [{}, WINDOW_YARN], ids=["full", "sliding_window_yarn"])
def test_tp1_parity_logits_loss_grads(tmp_path, overrides):
    src = save_hf(tmp_path / "hf", **copy.deepcopy(overrides))  # transformers fills rope_scaling in place
    data = batch()
    worst = compare(nxd_forward_backward(str(src), data), hf_reference(src, data))
    print(f"\nTP=1 {overrides or 'full attention'}: worst relative error {worst:.3g}")


def test_export_roundtrip_and_generate(tmp_path):
    src = save_hf(tmp_path / "hf", **copy.deepcopy(WINDOW_YARN))
    spec, model = build_from_hf("mixtral", src)
    assert_export_roundtrip(spec, model, src, tmp_path / "out", batch()["input_ids"][:, :5], new_tokens=20)
