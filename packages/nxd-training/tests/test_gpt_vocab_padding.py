"""A model that pads its vocabulary (``padded_vocab_size``: nxd-models-gpt Megatron-style,
nxd-models-llama to a multiple of TP) plans at a TP degree that does not divide the tokenizer's
vocabulary (GPT-2's 50257 at TP=2/8)."""

from __future__ import annotations


def test_padding_model_plans_with_an_odd_vocabulary(make_config) -> None:
    from nxd_training.config import load_config, model_config_of, model_spec_of

    run = load_config(make_config(model={"architecture": "gpt", "vocab_size": 515})).run
    spec = model_spec_of(run)
    assert spec.name == "gpt" and model_config_of(run, spec).padded_vocab_size(2) == 768
    # nxd's Llama pads inside its TP layers (pad=True): it plans too
    run = load_config(make_config(model={"architecture": "llama", "vocab_size": 515})).run
    spec = model_spec_of(run)
    assert spec.name == "llama" and model_config_of(run, spec).padded_vocab_size(2) == 516
