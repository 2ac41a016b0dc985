"""One process against transformers' DeepseekV3ForCausalLM: logits, loss and every gradient (MLA with
and without the q low-rank projection, interleaved and plain RoPE); export reloads in transformers
with the same logits, tensor for tensor (the expert bias included); greedy generation equals
transformers'; the YaRN scaling of the released model is refused by name."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from deepseek_test_utils import SPEC, batch, nxd_forward_backward, save_hf  # noqa: E402

from nxd.errors import ConfigError
from nxd_testing.reference import assert_parity, build_from_hf, hf_lm_reference, quiet_transformers

quiet_transformers()

CASES = {"mla": {}, "no_q_lora_plain_rope": dict(q_lora_rank=None, rope_interleave=False)}


@pytest.mark.parametrize("case", list(CASES))
def test_tp1_parity_logits_loss_grads(tmp_path, case):
    src = save_hf(tmp_path / "hf", **CASES[case])
    data = batch()
    worst = assert_parity(nxd_forward_backward(str(src), data), hf_lm_reference(src, data))
    print(f"\ndeepseek_v3 {case} TP=1: worst relative error {worst:.3g}")


def test_export_roundtrip_and_generate(tmp_path):
    from safetensors.torch import load_file
    from transformers import DeepseekV3ForCausalLM

    src = save_hf(tmp_path / "hf")
    spec, model = build_from_hf(SPEC[0], src)
    spec.save_hf(model, str(tmp_path / "out"))
    a, b = load_file(str(src / "model.safetensors")), load_file(str(tmp_path / "out" / "model.safetensors"))
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
    hf = DeepseekV3ForCausalLM.from_pretrained(str(src))
    prompt = batch()["input_ids"][:, :5]
    assert torch.equal(DeepseekV3ForCausalLM.from_pretrained(str(tmp_path / "out"))(prompt).logits, hf(prompt).logits)
    assert spec.generate(model, prompt, 12).equal(hf.generate(prompt, max_new_tokens=12, do_sample=False))


def test_yarn_rope_is_refused():
    import nxd

    spec = nxd.get_model("deepseek_v3")
    with pytest.raises(ConfigError, match="yarn"):
        spec.config_from_dict({"preset": "deepseek-v3-tiny", "rope_scaling": {"rope_type": "yarn", "factor": 40.0}})
