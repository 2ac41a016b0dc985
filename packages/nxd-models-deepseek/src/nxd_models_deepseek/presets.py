"""Named DeepSeek-V3 configurations (Hugging Face ``config.json`` values)."""

from __future__ import annotations

from typing import Any

from nxd.errors import ConfigError

PRESETS: dict[str, dict[str, Any]] = {
    # tests and CPU smoke runs: 3 layers (the first dense), 8 routed experts in 4 groups, 1 shared
    "deepseek-v3-tiny": {"vocab_size": 4096, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 3,
                         "num_attention_heads": 4, "num_key_value_heads": 4, "max_position_embeddings": 1024,
                         "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "moe_intermediate_size": 32,
                         "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2, "n_group": 4,
                         "topk_group": 2, "routed_scaling_factor": 2.5, "first_k_dense_replace": 1,
                         "q_lora_rank": 32, "kv_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 16,
                         "v_head_dim": 16, "initializer_range": 0.1},
}


def preset(name: str, **overrides: Any) -> dict[str, Any]:
    if name not in PRESETS:
        raise ConfigError(f"unknown deepseek_v3 preset {name!r}; valid: {sorted(PRESETS)}")
    return {**PRESETS[name], **overrides}
