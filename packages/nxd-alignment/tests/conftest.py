"""Shared fixtures: a tokenizer trained once on the embedded corpus, a tiny Llama config.json, and
a synthetic preference set whose chosen responses follow a learnable rule."""

from __future__ import annotations

import json
import random

import pytest

VOCAB = 512
WORDS = ["king", "love", "night", "sword", "crown", "heart", "storm", "blood"]
#: the 8B config.json NxDT points at, shrunk to a tiny model (what model.model_config names)
TINY_LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": VOCAB, "hidden_size": 32,
              "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "hidden_act": "silu",
              "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2}


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    from nxd_data.quickstart import prepare_quickstart_data

    return prepare_quickstart_data(tmp_path_factory.mktemp("corpus"), vocab_size=VOCAB)


@pytest.fixture(scope="session")
def tiny_json(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("tiny_llama") / "config.json"
    path.write_text(json.dumps(TINY_LLAMA))
    return str(path)


@pytest.fixture(scope="session")
def pairs_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The chosen response repeats the prompt's word; the rejected one names two other words."""
    rng = random.Random(0)
    path = tmp_path_factory.mktemp("pairs") / "data_dpo.jsonl"
    with path.open("w") as f:
        for i in range(64):
            w = WORDS[i % len(WORDS)]
            a, b = rng.sample([x for x in WORDS if x != w], 2)
            f.write(json.dumps({"prompt": f"Say {w} twice:", "chosen": f" {w} {w}", "rejected": f" {a} {b}"}) + "\n")
    return str(path)
