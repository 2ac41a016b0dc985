"""Mistral (``model_type: mistral``, the ``mistral`` spec): Mistral-7B-v0.1's published config.json
(fixtures/mistral-7b-v0.1-config.json, verbatim) shrunk only in size, against transformers'
``MistralForCausalLM``: logits, loss and every gradient at TP=1 and TP=2 (2 gloo ranks) with the
published window (4096, longer than the sequence) and with a window shorter than the sequence (the
sliding-window mask at work); the export is lossless (tensors bit for bit, config.json fields) and
greedy generation past the window equals transformers'."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from nxd_testing import reference as oracle

oracle.quiet_transformers()

PUBLISHED = json.loads((Path(__file__).parent / "fixtures" / "mistral-7b-v0.1-config.json").read_text())
SHRUNK = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              vocab_size=128)
SEQ = 16
#: the published window, and one shorter than the sequence
WINDOWS = {"published": PUBLISHED["sliding_window"], "window5": 5}
EXPORT = "nxd_models_llama:collect_hf_state_dict"


def published_tiny(out: Path, window: int) -> Path:
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    config = MistralConfig(**{**PUBLISHED, **SHRUNK, "sliding_window": window, "initializer_range": 0.1})
    return oracle.save_hf_oracle(MistralForCausalLM(config).float(), out, spread_norms=True)


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, Path]:
    return {name: published_tiny(tmp_path_factory.mktemp(name), window) for name, window in WINDOWS.items()}


def test_published_config_selects_mistral():
    import nxd

    spec = nxd.get_model("mistral")
    config = spec.config_from_dict(PUBLISHED)
    assert config.sliding_window == 4096 and config.FAMILY == "mistral"
    assert "mistral" in spec.hf_model_types and "mistral" not in nxd.get_model("llama").hf_model_types
    assert "model.sliding_window" in spec.implements


def test_tp1_and_tp2_logits_match_transformers(sources, rank_pool):
    data = oracle.random_lm_batch(1, 2, SEQ, SHRUNK["vocab_size"])
    pool = rank_pool(2)
    for name, src in sources.items():
        ref = oracle.hf_lm_reference(src, data)
        results = {1: oracle.parallel_logits_body(1, "mistral", EXPORT, str(src), data),
                   2: pool.run(oracle.parallel_logits_body, 2, "mistral", EXPORT, str(src), data)[0]}
        for tp, result in results.items():
            errors = oracle.parity_errors(result, ref)
            print(f"\nmistral {name} (window {WINDOWS[name]}, seq {SEQ}) TP={tp}: max |logits diff| "
                  f"{oracle.max_abs_logits_diff(result, ref):.3g}, worst relative error {max(errors.values()):.3g}")
            assert max(errors.values()) <= 1e-5, (name, tp, errors)


def test_export_is_lossless_and_generation_passes_the_window(sources, tmp_path):
    for name, src in sources.items():
        spec, model = oracle.build_from_hf("mistral", src)
        prompt = oracle.random_lm_batch(2, 2, 4, SHRUNK["vocab_size"])["input_ids"]
        oracle.assert_export_roundtrip(spec, model, src, tmp_path / name, prompt, new_tokens=8)
