"""Mistral (``model_type: mistral``): Llama's decoder with Hugging Face's sliding-window attention
(query ``i`` sees keys ``j`` with ``i - j < sliding_window``; ``null`` = full causal, as Mistral
v0.2+ configs write it). The model is :class:`nxd_models_llama.LlamaForCausalLM`, whose mask
applies a config's ``sliding_window``; import/export is Llama's under Mistral's names."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nxd.errors import ConfigError
from nxd_models_llama.config import LlamaConfig

#: Released Mistral configurations (Hugging Face ``config.json`` values), and a tiny one for tests
PRESETS: dict[str, dict[str, Any]] = {
    "mistral-7b-v0.1": {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                        "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 32768,
                        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "sliding_window": 4096, "bos_token_id": 1,
                        "eos_token_id": 2},
    "mistral-tiny": {"vocab_size": 4096, "hidden_size": 128, "intermediate_size": 352, "num_hidden_layers": 2,
                     "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 1024,
                     "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "sliding_window": 64, "bos_token_id": 1,
                     "eos_token_id": 2},
}


def preset(name: str, **overrides: Any) -> dict[str, Any]:
    """A copy of preset ``name`` with ``overrides`` applied."""
    if name not in PRESETS:
        raise ConfigError(f"unknown mistral preset {name!r}; valid: {sorted(PRESETS)}")
    return {**PRESETS[name], **overrides}


@dataclass
class MistralConfig(LlamaConfig):
    """Field names and defaults are transformers' ``MistralConfig`` (a ``config.json`` that leaves a
    key out means the same model to both)."""

    FAMILY = "mistral"

    intermediate_size: int = 14336
    num_key_value_heads: int | None = 8
    max_position_embeddings: int = 4096 * 32
    sliding_window: int | None = 4096

    def validate(self) -> None:
        super().validate()
        window = self.sliding_window
        if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
            raise ConfigError(f"mistral config: sliding_window must be a positive integer or null, got {window!r}")
        if self.attention_bias or self.mlp_bias:
            raise ConfigError("mistral config: attention_bias/mlp_bias are not part of Mistral")

    def to_hf_dict(self) -> dict[str, Any]:
        """A ``config.json`` transformers' ``MistralForCausalLM`` reads (sliding window included)."""
        out = super().to_hf_dict()
        for key in ("attention_bias", "mlp_bias"):  # validated false; HF's Mistral has neither
            out.pop(key)
        out.update({"architectures": ["MistralForCausalLM"], "model_type": "mistral",
                    "sliding_window": self.sliding_window})
        return out
