"""Named GPT configurations (real model sizes, Megatron keys)."""

from __future__ import annotations

from typing import Any

from nxd.errors import ConfigError

_GPT2 = dict(vocab_size=50257, max_position_embeddings=1024, normalization="LayerNorm", activation="gelu",
             openai_gelu=True, position_embedding_type="learned_absolute", has_bias=True,
             share_embeddings_and_output_weights=True, layernorm_epsilon=1e-5, init_method_std=0.02)
_PYTHIA = dict(vocab_size=50304, max_position_embeddings=2048, normalization="LayerNorm", activation="gelu",
               position_embedding_type="rope", rotary_percentage=0.25, parallel_residual=True, has_bias=True,
               share_embeddings_and_output_weights=False, layernorm_epsilon=1e-5)

PRESETS: dict[str, dict[str, Any]] = {
    "gpt2": dict(_GPT2, hidden_size=768, num_layers=12, num_attention_heads=12),
    "gpt2-medium": dict(_GPT2, hidden_size=1024, num_layers=24, num_attention_heads=16),
    "gpt2-large": dict(_GPT2, hidden_size=1280, num_layers=36, num_attention_heads=20),
    "gpt2-xl": dict(_GPT2, hidden_size=1600, num_layers=48, num_attention_heads=25),
    "pythia-160m": dict(_PYTHIA, hidden_size=768, num_layers=12, num_attention_heads=12),
    "pythia-1b": dict(_PYTHIA, hidden_size=2048, num_layers=16, num_attention_heads=8),
    # NxDT's examples/conf/megatron_gpt_config.yaml model section
    "megatron-gpt-7b": dict(vocab_size=50257, hidden_size=4096, ffn_hidden_size=16384, num_layers=32,
                            num_attention_heads=32, max_position_embeddings=2048, init_method_std=0.021,
                            apply_query_key_layer_scaling=True, make_vocab_size_divisible_by=8),
    "gpt-tiny": dict(vocab_size=256, hidden_size=64, num_layers=2, num_attention_heads=4,
                     max_position_embeddings=128, hidden_dropout=0.0, attention_dropout=0.0),
}


def preset(name: str, **overrides: Any) -> dict[str, Any]:
    if name not in PRESETS:
        raise ConfigError(f"gpt: unknown preset {name!r}; available: {sorted(PRESETS)}")
    return {**PRESETS[name], **overrides}
