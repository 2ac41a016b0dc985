"""Named Qwen3 / Qwen3-MoE configurations (Hugging Face ``config.json`` values)."""

from __future__ import annotations

from typing import Any

from nxd.errors import ConfigError

_QWEN3 = {"vocab_size": 151936, "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
          "head_dim": 128, "bos_token_id": 151643, "eos_token_id": 151645}

QWEN3_PRESETS: dict[str, dict[str, Any]] = {
    "qwen3-0.6b": {**_QWEN3, "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
                   "num_attention_heads": 16, "num_key_value_heads": 8, "tie_word_embeddings": True},
    "qwen3-8b": {**_QWEN3, "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
                 "num_attention_heads": 32, "num_key_value_heads": 8},
    # tests and CPU smoke runs
    "qwen3-tiny": {"vocab_size": 4096, "hidden_size": 64, "intermediate_size": 176, "num_hidden_layers": 2,
                   "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
                   "max_position_embeddings": 1024, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
                   "tie_word_embeddings": True},
}

QWEN3_MOE_PRESETS: dict[str, dict[str, Any]] = {
    "qwen3-30b-a3b": {**_QWEN3, "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 48,
                      "num_attention_heads": 32, "num_key_value_heads": 4, "num_local_experts": 128,
                      "num_experts_per_tok": 8, "moe_intermediate_size": 768, "norm_topk_prob": True,
                      "router_aux_loss_coef": 0.001},
    "qwen3-moe-tiny": {"vocab_size": 4096, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                       "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                       "max_position_embeddings": 1024, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
                       "num_local_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                       "norm_topk_prob": True, "router_aux_loss_coef": 0.001, "output_router_logits": True,
                       "initializer_range": 0.1},
}


def preset(presets: dict[str, dict[str, Any]], name: str, **overrides: Any) -> dict[str, Any]:
    if name not in presets:
        raise ConfigError(f"unknown preset {name!r}; valid: {sorted(presets)}")
    return {**presets[name], **overrides}
