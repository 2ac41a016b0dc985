"""Inputs every cell of the composition matrix shares, made once: the embedded corpus and its
tokenizer, an SFT JSONL file (the preference set, ``pairs_file``, is nxd-testing's fixture), and per family a tiny Hugging Face folder (transformers
writes it; the ``transformers`` family's is OLMo 2, a model_type no nxd family lists) and the same weights as an nxd checkpoint (``nxd ckpt convert --from hf --to nxd``)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch

from nxd_testing.preference_pairs import WORDS  # the preference set (pairs_file) is nxd-testing's fixture

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # importlib mode: axes/pairwise by name

VOCAB = 512

#: shared sizes; head size 8, KV heads 2 (4 for DeepSeek-V3's latent attention, where every head has its keys)
COMMON = {"vocab_size": VOCAB, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
          "max_position_embeddings": 64, "tie_word_embeddings": False}


def _hf_config(family: str):
    import transformers as tf

    if family == "llama":
        return tf.LlamaConfig(**COMMON, intermediate_size=64, num_key_value_heads=2)
    if family == "qwen3":
        return tf.Qwen3Config(**COMMON, intermediate_size=64, num_key_value_heads=2, head_dim=8)
    if family == "qwen3_moe":
        return tf.Qwen3MoeConfig(**COMMON, intermediate_size=64, moe_intermediate_size=32, num_key_value_heads=2,
                                 head_dim=8, num_experts=4, num_experts_per_tok=2, decoder_sparse_step=1)
    if family == "mixtral":
        return tf.MixtralConfig(**COMMON, intermediate_size=32, num_key_value_heads=2, num_local_experts=4,
                                num_experts_per_tok=2)
    if family == "deepseek_v3":
        return tf.DeepseekV3Config(**COMMON, intermediate_size=64, moe_intermediate_size=32, num_key_value_heads=4,
                                   n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, n_group=2,
                                   topk_group=1, first_k_dense_replace=1, q_lora_rank=16, kv_lora_rank=16,
                                   qk_rope_head_dim=4, qk_nope_head_dim=4, v_head_dim=8, rope_scaling=None)
    if family == "gpt":
        return tf.GPTNeoXConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                intermediate_size=64, max_position_embeddings=64, rotary_pct=1.0,
                                tie_word_embeddings=False)
    if family == "transformers":  # nxd-models-transformers: an OLMo 2 folder, built as transformers' own class
        return tf.Olmo2Config(**COMMON, intermediate_size=64, num_key_value_heads=2)
    raise KeyError(family)


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    from nxd_data.quickstart import prepare_quickstart_data

    return prepare_quickstart_data(tmp_path_factory.mktemp("corpus"), vocab_size=VOCAB)


@pytest.fixture(scope="session")
def sft_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("sft") / "train.jsonl"
    with path.open("w") as f:
        for i in range(64):
            w = WORDS[i % len(WORDS)]
            f.write(json.dumps({"prompt": f"Say {w} twice:", "completion": f" {w} {w}"}) + "\n")
    return str(path)


@pytest.fixture(scope="session")
def hf_folder(tmp_path_factory: pytest.TempPathFactory):
    """``hf_folder(family)`` -> a tiny HF model folder of that family (written on first use)."""
    made: dict[str, Path] = {}

    def get(family: str) -> Path:
        if family not in made:
            from transformers import AutoModelForCausalLM

            torch.manual_seed(11)
            out = tmp_path_factory.mktemp(f"hf-{family}")
            AutoModelForCausalLM.from_config(_hf_config(family)).save_pretrained(out, safe_serialization=True)
            made[family] = out
        return made[family]

    return get


@pytest.fixture(scope="session")
def nxd_checkpoint(hf_folder, tmp_path_factory: pytest.TempPathFactory):
    """``nxd_checkpoint(family)`` -> an nxd checkpoint folder holding the HF folder's weights."""
    from nxd.cli import main

    made: dict[str, Path] = {}

    def get(family: str) -> Path:
        if family not in made:
            out = tmp_path_factory.mktemp(f"nxd-{family}") / "ckpt"
            rc = main(["ckpt", "convert", "--from", "hf", "--to", "nxd", "--input", str(hf_folder(family)),
                       "--output", str(out), "--model", family])
            assert rc == 0, f"nxd ckpt convert --from hf --to nxd failed for {family}"
            made[family] = out
        return made[family]

    return get


@pytest.fixture(scope="session")
def pools():
    """``pools(n)`` -> a pool of ``n`` gloo ranks kept for the whole session, one per world size:
    resharded resumes change the world size every cell, and restarting ranks (imports) costs more
    than the cells themselves; idle ranks cost memory only."""
    from nxd_testing.ranks import RankPool

    held: dict[int, RankPool] = {}

    def get(world_size: int) -> RankPool:
        if world_size not in held:
            held[world_size] = RankPool(world_size)
        return held[world_size]

    yield get
    for pool in held.values():
        pool.close()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """With NXD_MATRIX_LOG set, each cell's result is appended there as it ends (a matrix run is long)."""
    log = os.environ.get("NXD_MATRIX_LOG")
    if log and report.when == "call":
        with open(log, "a") as f:
            f.write(f"{report.outcome.upper()} {report.nodeid} {report.duration:.1f}s\n")
            if report.failed:
                f.write(report.longreprtext[-4000:] + "\n\n")
