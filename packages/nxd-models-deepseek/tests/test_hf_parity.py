"""One process against transformers' DeepseekV3ForCausalLM: logits, loss and every gradient (MLA with
and without the q low-rank projection, interleaved and plain RoPE); export reloads in transformers
with the same logits, tensor for tensor (the expert bias included); greedy generation equals
transformers'; a rope scaling nxd does not implement is refused naming this family (the released
model's YaRN is tested in test_published_config.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from deepseek_test_utils import SPEC, batch, nxd_forward_backward, save_hf  # noqa: E402

from nxd.errors import ConfigError
from nxd_testing.reference import (
    assert_export_roundtrip,
    assert_parity,
    build_from_hf,
    hf_lm_reference,
    quiet_transformers,
)

quiet_transformers()

CASES = {"mla": {}, "no_q_lora_plain_rope": dict(q_lora_rank=None, rope_interleave=False)}


def test_tp1_parity_logits_loss_grads(tmp_path):
    data = batch()
    for case, overrides in CASES.items():  # MLA as released; without the q low-rank path and with plain RoPE
        src = save_hf(tmp_path / case, **overrides)
        worst = assert_parity(nxd_forward_backward(str(src), data), hf_lm_reference(src, data))
        print(f"\ndeepseek_v3 {case} TP=1: worst relative error {worst:.3g}")


def test_export_roundtrip_and_generate(tmp_path):
    src = save_hf(tmp_path / "hf")
    spec, model = build_from_hf(SPEC[0], src)
    assert_export_roundtrip(spec, model, src, tmp_path / "out", batch()["input_ids"][:, :5])


def test_unsupported_rope_scaling_is_refused_naming_the_family():
    import nxd

    spec = nxd.get_model("deepseek_v3")
    with pytest.raises(ConfigError, match="deepseek_v3 config: rope_scaling.rope_type 'dynamic' is not supported"):
        spec.config_from_dict({"preset": "deepseek-v3-tiny", "rope_scaling": {"rope_type": "dynamic", "factor": 4.0}})
