"""A model that pads its vocabulary Megatron-style (nxd-models-gpt: ``padded_vocab_size``) plans
at a TP degree that does not divide the tokenizer's vocabulary (GPT-2's 50257 at TP=2/8)."""

from __future__ import annotations

import pytest

from nxd import ConfigError


def test_padding_model_plans_with_an_odd_vocabulary(make_config) -> None:
    from nxd_training.config import load_config, make_plan

    plan = make_plan(load_config(make_config(model={"architecture": "gpt", "vocab_size": 515})))
    assert plan.spec.name == "gpt" and plan.model_config.padded_vocab_size(2) == 768
    with pytest.raises(ConfigError, match="vocab_size=515 must be divisible by tensor_model_parallel_size=2"):
        load_config(make_config(model={"architecture": "llama", "vocab_size": 515}))
