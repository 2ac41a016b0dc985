"""Small configs for the plan (their data files need not exist: nothing is read)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

#: NxD Training's vendored example configs (nxd-training's compatibility oracle)
NXDT_CONF = Path(__file__).resolve().parents[2] / "nxd-training" / "tests" / "data" / "nxdt_conf"


def tiny(**sections: Any) -> dict[str, Any]:
    """A Llama of 4 layers on 8 ranks (TP 2 x PP 2 x DP 2, ZeRO-1, SP); ``sections`` merge on top."""
    config: dict[str, Any] = {
        "name": "tiny",
        "trainer": {"devices": 8, "max_steps": 1, "accelerator": "cpu"},
        "exp_manager": {"create_checkpoint_callback": False, "resume_if_exists": False},
        "distributed_strategy": {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2, "zero1": True,
                                 "sequence_parallel": True},
        "data": {"module": "indexed", "data_prefix": "/nonexistent/text_document", "micro_batch_size": 1,
                 "global_batch_size": 8, "seq_length": 64},
        "model": {"architecture": "llama", "vocab_size": 512, "hidden_size": 64, "ffn_hidden_size": 128,
                  "num_layers": 4, "num_attention_heads": 4, "num_kv_heads": 2, "max_position_embeddings": 64,
                  "encoder_seq_length": 64},
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


@pytest.fixture(name="tiny")
def tiny_fixture():
    """``tiny(**sections)`` -> the small config dict."""
    return tiny


@pytest.fixture(name="nxdt_conf")
def nxdt_conf_fixture() -> Path:
    return NXDT_CONF


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A real tokenizer and indexed dataset (runs and ``nxd train --validate`` read them)."""
    from nxd_data.quickstart import prepare_quickstart_data

    return prepare_quickstart_data(tmp_path_factory.mktemp("corpus"), vocab_size=512)
