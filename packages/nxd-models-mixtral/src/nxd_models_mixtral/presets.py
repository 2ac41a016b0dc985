"""Named Mixtral configurations (Hugging Face ``config.json`` values)."""

from __future__ import annotations

from typing import Any

from nxd.errors import ConfigError

PRESETS: dict[str, dict[str, Any]] = {
    "mixtral-8x7b": dict(vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                         num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=32768,
                         rms_norm_eps=1e-5, rope_theta=1e6, num_local_experts=8, num_experts_per_tok=2,
                         router_aux_loss_coef=0.02, sliding_window=None),
    "mixtral-8x22b": dict(vocab_size=32768, hidden_size=6144, intermediate_size=16384, num_hidden_layers=56,
                          num_attention_heads=48, num_key_value_heads=8, max_position_embeddings=65536,
                          rms_norm_eps=1e-5, rope_theta=1e6, num_local_experts=8, num_experts_per_tok=2,
                          router_aux_loss_coef=0.001, sliding_window=None),
    # tests and tiny runs: hidden 32, 4 experts, 2 layers
    "mixtral-tiny": dict(vocab_size=128, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         rms_norm_eps=1e-5, rope_theta=1e6, num_local_experts=4, num_experts_per_tok=2,
                         router_aux_loss_coef=0.02, output_router_logits=True, initializer_range=0.1),
}


def preset(name: str, **overrides: Any) -> dict[str, Any]:
    if name not in PRESETS:
        raise ConfigError(f"unknown mixtral preset {name!r}; valid: {sorted(PRESETS)}")
    return {**PRESETS[name], **overrides}
