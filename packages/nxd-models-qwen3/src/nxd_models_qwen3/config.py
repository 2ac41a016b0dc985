"""Qwen3 and Qwen3-MoE configurations: Hugging Face ``Qwen3Config`` / ``Qwen3MoeConfig`` keys in.

Qwen3 is Llama's decoder with an RMSNorm on every query and key head (``qk_norm``); Qwen3-MoE is
that attention with Mixtral's sparse block renamed (``mlp.gate``, ``mlp.experts.{e}.gate_proj``),
fine-grained experts of ``moe_intermediate_size``, optional renormalisation of the chosen
probabilities (``norm_topk_prob``) and dense layers (``mlp_only_layers``, ``decoder_sparse_step``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from nxd.errors import ConfigError
from nxd_models_llama import LlamaConfig
from nxd_models_mixtral import MixtralConfig
from nxd_moe import MoEConfig


def without_sliding_window(data: dict[str, Any], family: str) -> dict[str, Any]:
    """Drop HF's sliding-window keys, refusing a config that turns the window on (nxd's Qwen3
    attends to the full causal context, as every released Qwen3 does)."""
    data = dict(data)
    if data.pop("use_sliding_window", False):
        raise ConfigError(f"{family} config: use_sliding_window=true is not implemented (full causal attention only)")
    layer_types = data.pop("layer_types", None) or []
    if any(t != "full_attention" for t in layer_types):
        raise ConfigError(f"{family} config: layer_types other than 'full_attention' are not implemented")
    for key in ("sliding_window", "max_window_layers"):
        data.pop(key, None)
    return data


def relabelled(out: dict[str, Any], architecture: str, model_type: str) -> dict[str, Any]:
    """A parent family's ``config.json`` dict relabelled for ``architecture`` (no Llama/Mixtral-only keys)."""
    for key in ("mlp_bias", "sliding_window", "router_jitter_noise"):
        out.pop(key, None)
    out.update({"architectures": [architecture], "model_type": model_type, "use_sliding_window": False})
    return out


@dataclass
class Qwen3Config(LlamaConfig):
    """Qwen3 dense (field names are Hugging Face's; ``qk_norm`` is always on; sizes come from the
    checkpoint's ``config.json`` or a preset)."""

    FAMILY = "qwen3"

    rms_norm_eps: float = 1e-6
    qk_norm: bool = True

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Qwen3Config:
        if isinstance(data, dict):
            data = without_sliding_window(data, "qwen3")
        return super().from_dict(data)  # type: ignore[return-value]

    def to_hf_dict(self) -> dict[str, Any]:
        return relabelled(super().to_hf_dict(), "Qwen3ForCausalLM", "qwen3")


@dataclass
class Qwen3MoeConfig(MixtralConfig):
    """Qwen3-MoE (Hugging Face's field names; HF's ``num_experts`` is ``num_local_experts`` here)."""

    FAMILY = "qwen3_moe"
    MOE_MODULE = "mlp"
    HF_EXPERT_NAMES = ("gate_proj", "up_proj", "down_proj")

    rms_norm_eps: float = 1e-6
    moe_intermediate_size: int = 768
    norm_topk_prob: bool = False
    decoder_sparse_step: int = 1
    mlp_only_layers: list[int] = field(default_factory=list)
    qk_norm: bool = True

    def is_moe_layer(self, index: int) -> bool:
        """Hugging Face's rule: not listed in ``mlp_only_layers`` and ``(index + 1) % decoder_sparse_step == 0``."""
        return index not in self.mlp_only_layers and (index + 1) % self.decoder_sparse_step == 0

    @property
    def expert_intermediate_size(self) -> int:
        return self.moe_intermediate_size

    def validate(self) -> None:
        if not isinstance(self.decoder_sparse_step, int) or self.decoder_sparse_step < 1:
            raise ConfigError(f"qwen3_moe config: decoder_sparse_step must be a positive integer, "
                              f"got {self.decoder_sparse_step!r}")
        super().validate()

    def moe_config(self) -> MoEConfig:
        """Mixtral's settings with Qwen3-MoE's renormalisation switch (``norm_topk_prob``)."""
        return dataclasses.replace(super().moe_config(), normalize_top_k_affinities=self.norm_topk_prob)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Qwen3MoeConfig:
        if isinstance(data, dict):
            data = without_sliding_window(data, "qwen3_moe")
            if "num_experts" in data:
                data.setdefault("num_local_experts", data.pop("num_experts"))
        return super().from_dict(data)  # type: ignore[return-value]

    def to_hf_dict(self) -> dict[str, Any]:
        out = relabelled(super().to_hf_dict(), "Qwen3MoeForCausalLM", "qwen3_moe")
        out.update({"num_experts": self.num_local_experts, "moe_intermediate_size": self.moe_intermediate_size,
                    "norm_topk_prob": self.norm_topk_prob, "decoder_sparse_step": self.decoder_sparse_step,
                    "mlp_only_layers": list(self.mlp_only_layers)})
        out.pop("num_local_experts", None)
        return out
