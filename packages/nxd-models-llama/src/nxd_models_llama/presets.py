"""Named configurations of released Llama models (Hugging Face ``config.json`` values)."""

from __future__ import annotations

from typing import Any

from nxd.errors import ConfigError

_LLAMA2 = {"vocab_size": 32000, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
           "bos_token_id": 1, "eos_token_id": 2}
_LLAMA3 = {"vocab_size": 128256, "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
           "bos_token_id": 128000, "eos_token_id": 128001}
_LLAMA31_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                 "original_max_position_embeddings": 8192}
_8B = {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
       "num_key_value_heads": 8}
_70B = {"hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80, "num_attention_heads": 64,
        "num_key_value_heads": 8}

PRESETS: dict[str, dict[str, Any]] = {
    "llama2-7b": {**_LLAMA2, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
                  "num_attention_heads": 32, "num_key_value_heads": 32},
    "llama2-13b": {**_LLAMA2, "hidden_size": 5120, "intermediate_size": 13824, "num_hidden_layers": 40,
                   "num_attention_heads": 40, "num_key_value_heads": 40},
    "llama2-70b": {**_LLAMA2, **_70B},
    "llama3-8b": {**_LLAMA3, **_8B},
    "llama3-70b": {**_LLAMA3, **_70B},
    "llama3.1-8b": {**_LLAMA3, **_8B, "max_position_embeddings": 131072, "rope_scaling": dict(_LLAMA31_ROPE)},
    "llama3.1-70b": {**_LLAMA3, **_70B, "max_position_embeddings": 131072, "rope_scaling": dict(_LLAMA31_ROPE)},
    "llama3.2-1b": {**_LLAMA3, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
                    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
                    "tie_word_embeddings": True, "max_position_embeddings": 131072,
                    "rope_scaling": {**_LLAMA31_ROPE, "factor": 32.0}},
    # For tests, the quickstart and CPU smoke runs: GQA, llama3 RoPE, a few MB of weights.
    "llama-tiny": {"vocab_size": 4096, "hidden_size": 128, "intermediate_size": 352, "num_hidden_layers": 2,
                   "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 1024,
                   "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "bos_token_id": 1, "eos_token_id": 2},
}


def preset(name: str, **overrides: Any) -> dict[str, Any]:
    """A copy of preset ``name`` with ``overrides`` applied."""
    if name not in PRESETS:
        raise ConfigError(f"unknown llama preset {name!r}; valid: {sorted(PRESETS)}")
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in PRESETS[name].items()}
    out.update(overrides)
    return out
