"""Every vendored NxD Training config planned at its own world size and model size (slow: 3-55 s
each here). A config naming a Hugging Face ``config.json`` on NxDT's machines (``model.model_config``)
gets a local one with the real architecture its name says (8B, 70B, 405B, Llama-2 7B, Mixtral
8x7B); nothing else changes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nxd_plan.planner import make_run_plan
from nxd_training.config import read_yaml

LLAMA3_8B = {"model_type": "llama", "vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336,
             "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
             "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": False}
ARCHITECTURES = {
    "405B": {**LLAMA3_8B, "hidden_size": 16384, "intermediate_size": 53248, "num_hidden_layers": 126,
             "num_attention_heads": 128},
    "70B": {**LLAMA3_8B, "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
            "num_attention_heads": 64},
    "mixtral": {"model_type": "mixtral", "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336,
                "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "num_local_experts": 8,
                "num_experts_per_tok": 2, "max_position_embeddings": 32768, "rms_norm_eps": 1e-5, "rope_theta": 1e6},
    "7B": {**LLAMA3_8B, "vocab_size": 32000, "intermediate_size": 11008, "num_key_value_heads": 32,
           "max_position_embeddings": 4096},
    "8B": LLAMA3_8B,
}
#: NxD Training's vendored configs (nxd-training's compatibility oracle; conftest's ``nxdt_conf``)
CONFIGS = sorted((Path(__file__).resolve().parents[2] / "nxd-training" / "tests" / "data" / "nxdt_conf").glob("*.yaml"))


def model_config_override(path: Path, root: Path) -> list[str]:
    """``model.model_config`` pointed at a local config.json of the architecture the file names;
    GPT-2's vocabulary size where the vocabulary comes from GPT-2's files on NxDT's machine."""
    raw = read_yaml(path)
    tokenizer = (raw.get("data") or {}).get("tokenizer")
    if isinstance(tokenizer, dict) and tokenizer.get("type") == "GPT2BPETokenizer":
        return ["model.vocab_size=50257"]
    if "model_config" not in (raw.get("model") or {}):
        return []
    size = next((k for k in ARCHITECTURES if k.lower() in path.name.lower()), "8B")
    local = root / f"{size}.json"
    local.write_text(json.dumps(ARCHITECTURES[size]))
    return [f"model.model_config={local}"]


@pytest.mark.slow
@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_every_nxdt_config_plans(path: Path, tmp_path: Path) -> None:
    plan = make_run_plan(path, model_config_override(path, tmp_path))
    raw = read_yaml(path)
    assert plan.layout.world_size == raw["trainer"]["devices"] * raw["trainer"].get("num_nodes", 1)
    assert len(plan.ranks) == plan.layout.world_size and plan.parameters_total > 1e9
    assert all(r.peak_bytes > r.param_bytes > 0 for r in plan.ranks)
    assert plan.step_time_s > 0
