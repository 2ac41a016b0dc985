"""Shared fixtures: the embedded corpus prepared once, and a tiny valid config around it."""

from __future__ import annotations

import copy
import os
import sys
from pathlib import Path
from typing import Any

import pytest

# tests import their shared helpers (nxdt_files.py) by name; pytest runs in importlib mode
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

VOCAB = 512


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    from nxd_data.quickstart import prepare_quickstart_data

    return prepare_quickstart_data(tmp_path_factory.mktemp("corpus"), vocab_size=VOCAB)


def tiny_config(corpus: dict[str, str], exp_dir: Path | str, **sections: Any) -> dict[str, Any]:
    """A small, valid YAML-shaped config (dict); ``sections`` are deep-merged on top."""
    config: dict[str, Any] = {
        "name": "tiny",
        "seed": 7,
        "trainer": {"devices": 2, "max_steps": 6, "log_every_n_steps": 1, "val_check_interval": 0,
                    "limit_val_batches": 2, "enable_progress_bar": False, "accelerator": "cpu"},
        "exp_manager": {"exp_dir": str(exp_dir), "create_tensorboard_logger": True,
                        "checkpoint_callback_params": {"every_n_train_steps": 3, "save_top_k": 2}},
        "distributed_strategy": {"tensor_model_parallel_size": 2},
        "data": {"module": "indexed", "data_prefix": corpus["data_prefix"], "tokenizer": corpus["tokenizer"],
                 "micro_batch_size": 2, "global_batch_size": 4, "seq_length": 32, "splits_string": "950,50,0"},
        "model": {"architecture": "llama", "vocab_size": VOCAB, "hidden_size": 32, "ffn_hidden_size": 64,
                  "num_layers": 2, "num_attention_heads": 4, "num_kv_heads": 2, "max_position_embeddings": 64,
                  "optim": {"name": "adamw", "lr": 1e-2, "sched": {"name": "constant"}}},
        "precision": {"type": "fp32"},
    }
    return merge(config, sections)


def merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


@pytest.fixture
def make_config(corpus: dict[str, str], tmp_path: Path):
    """``make_config(**sections)`` -> a tiny valid config dict writing under this test's tmp_path."""

    def make(**sections: Any) -> dict[str, Any]:
        return tiny_config(corpus, tmp_path / "runs", **sections)

    return make


@pytest.fixture(scope="session")
def tiny(corpus: dict[str, str]):
    """``tiny(exp_dir, **sections)`` -> a tiny valid config dict (usable from wider-scoped fixtures)."""

    def make(exp_dir: Path | str, **sections: Any) -> dict[str, Any]:
        return tiny_config(corpus, exp_dir, **sections)

    return make


@pytest.fixture(scope="session")
def files(corpus: dict[str, str], tmp_path_factory: pytest.TempPathFactory):
    """Local stand-ins for the paths in NxDT's configs (nxdt_files.Files), made once per session."""
    from nxdt_files import Files

    return Files(tmp_path_factory.mktemp("nxdt"), corpus)


@pytest.fixture(scope="module")
def hf_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama in Hugging Face's format (config.json + model.safetensors), as a user downloads one."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(3)
    out = tmp_path_factory.mktemp("hf") / "tiny-llama"
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    LlamaForCausalLM(config).save_pretrained(out, safe_serialization=True)
    return out
