"""DeepSeek-V3's published config.json (fixtures/deepseek-v3-config.json, verbatim) shrunk only in
size: every other field as released, YaRN rope scaling with ``mscale``/``mscale_all_dim`` included
(its attention factor on cos/sin and its softmax scale). nxd's logits match transformers' at TP=1
and TP=2 (2 gloo ranks), and the export is lossless: the same tensors, bit for bit, and a
config.json transformers reads as the source's."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from deepseek_test_utils import BUFFERS, SPEC, batch  # noqa: E402

from nxd_testing import reference as oracle  # noqa: E402

oracle.quiet_transformers()

PUBLISHED = json.loads((Path(__file__).parent / "fixtures" / "deepseek-v3-config.json").read_text())
#: sizes only: 4 layers keep first_k_dense_replace=3 dense layers and one MoE layer; 32 routed
#: experts keep n_group=8 groups (4 each) of which topk_group=4 are searched for the top 8
SHRUNK = dict(hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=4,
              n_routed_experts=32, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=24, kv_lora_rank=16,
              qk_rope_head_dim=16, qk_nope_head_dim=12, v_head_dim=10, vocab_size=128)


def published_tiny(out: Path) -> Path:
    """A random transformers model of the shrunk published config, saved to ``out``.
    ``quantization_config`` is left out: it says how the released weights are stored (fp8 blocks),
    and these fp32 random ones are not; ``initializer_range`` 0.1 so every weight counts."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    config = {k: v for k, v in PUBLISHED.items() if k != "quantization_config"}
    torch.manual_seed(0)
    model = DeepseekV3ForCausalLM(DeepseekV3Config(**{**config, **SHRUNK, "initializer_range": 0.1})).float()
    assert model.config.rope_parameters["rope_type"] == "yarn"
    with torch.no_grad():
        for name, buf in model.named_buffers():
            if name.endswith(BUFFERS):
                buf.normal_(0.0, 0.3)
    return oracle.save_hf_oracle(model, out, spread_norms=True)


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    return published_tiny(tmp_path_factory.mktemp("deepseek-v3"))


def test_published_config_is_read_as_released(src):
    import nxd

    config = nxd.get_model("deepseek_v3").config_from_dict(json.loads((src / "config.json").read_text()))
    assert config.rope_type == "yarn" and config.rope_scaling["mscale_all_dim"] == 1.0
    assert config.max_position_embeddings == PUBLISHED["max_position_embeddings"]


def test_tp1_and_tp2_logits_match_transformers(src, rank_pool):
    data = batch()
    ref = oracle.hf_lm_reference(src, data)
    args = (SPEC[0], SPEC[1], str(src), data, BUFFERS)
    results = {1: oracle.parallel_logits_body(1, *args), 2: rank_pool(2).run(oracle.parallel_logits_body, 2, *args,
                                                                               timeout=600)[0]}
    for tp, result in results.items():
        errors = oracle.parity_errors(result, ref)
        print(f"\ndeepseek_v3 published config (yarn) TP={tp}: max |logits diff| "
              f"{oracle.max_abs_logits_diff(result, ref):.3g}, worst relative error (logits, loss, grads) "
              f"{max(errors.values()):.3g}")
        assert max(errors.values()) <= 1e-5, (tp, errors)


def test_export_is_lossless(src, tmp_path):
    spec, model = oracle.build_from_hf(SPEC[0], src)
    oracle.assert_export_roundtrip(spec, model, src, tmp_path / "out", batch()["input_ids"][:, :5], new_tokens=4)
