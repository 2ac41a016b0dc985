"""The ``qwen3`` and ``qwen3_moe`` :class:`nxd.specs.ModelSpec` s. Import/export, generation,
pipeline contract, LoRA's HF plan and the parallel layouts are Llama's (dense) and Mixtral's
(MoE): this module only names them for Qwen3's configs."""

from __future__ import annotations

import dataclasses
from typing import Any

from torch import nn

from nxd.resolved import NxdConfig
from nxd_core_parallel.modules.rms_norm import RMSNorm
from nxd_models_llama import LlamaCoreAttention, LlamaDecoderLayer, LlamaForCausalLM, LlamaMLP
from nxd_models_llama import flops_per_token as llama_flops_per_token
from nxd_models_llama.spec import SPEC as LLAMA_SPEC
from nxd_models_mixtral.spec import SPEC as MIXTRAL_SPEC
from nxd_models_mixtral.spec import builder
from nxd_models_mixtral.spec import flops_per_token as mixtral_flops_per_token
from nxd_models_qwen3.config import Qwen3Config, Qwen3MoeConfig
from nxd_models_qwen3.modeling import Qwen3MoeDecoderLayer, Qwen3MoeForCausalLM
from nxd_models_qwen3.plan import QWEN3_MOE_PLAN
from nxd_models_qwen3.presets import QWEN3_MOE_PRESETS, QWEN3_PRESETS, preset


def qwen3_config(data: dict[str, Any] | Qwen3Config) -> Qwen3Config:
    """HF ``config.json`` keys -> :class:`Qwen3Config`; ``{"preset": name, ...}`` starts from a preset."""
    if isinstance(data, dict) and "preset" in data:
        data = preset(QWEN3_PRESETS, data["preset"], **{k: v for k, v in data.items() if k != "preset"})
    return Qwen3Config.from_dict(data)


def qwen3_moe_config(data: dict[str, Any] | Qwen3MoeConfig) -> Qwen3MoeConfig:
    if isinstance(data, dict) and "preset" in data:
        data = preset(QWEN3_MOE_PRESETS, data["preset"], **{k: v for k, v in data.items() if k != "preset"})
    return Qwen3MoeConfig.from_dict(data)


def build_qwen3(config: Qwen3Config | dict, nxd_config: dict | None = None) -> nn.Module:
    """Llama's model with Qwen3's config (``qk_norm`` on)."""
    cfg = qwen3_config(config) if isinstance(config, dict) else config
    return LlamaForCausalLM(cfg, sequence_parallel=NxdConfig.of(nxd_config).sequence_parallel)


build_qwen3_moe = builder(Qwen3MoeForCausalLM, qwen3_moe_config)


def qwen3_flops_per_token(config: Qwen3Config | dict, seq_length: int | None = None) -> float:
    return llama_flops_per_token(qwen3_config(config) if isinstance(config, dict) else config, seq_length)


def qwen3_moe_flops_per_token(config: Qwen3MoeConfig | dict, seq_length: int | None = None) -> float:
    return mixtral_flops_per_token(qwen3_moe_config(config) if isinstance(config, dict) else config, seq_length)


#: NxD Training's recompute names -> ours
_RECOMPUTE = {"CoreAttention": (LlamaCoreAttention,), "Qwen3RMSNorm": (RMSNorm,)}

#: Llama's spec (layers, attention, HF import/export, generate, LoRA plan, CP) for Qwen3's configs
QWEN3_SPEC = dataclasses.replace(
    LLAMA_SPEC, name="qwen3", config_from_dict=qwen3_config, build=build_qwen3, hf_model_types=("qwen3",),
    recompute_modules={**_RECOMPUTE, "Qwen3MLP": (LlamaMLP,), "Qwen3DecoderLayer": (LlamaDecoderLayer,)},
    flops_per_token=qwen3_flops_per_token, presets=QWEN3_PRESETS,
    extras={**LLAMA_SPEC.extras, "config_class": Qwen3Config},
)

#: Mixtral's spec (MoE model, HF import/export by the config's names, generate) for Qwen3-MoE, plus
#: Llama's LoRA plan for the attention projections
QWEN3_MOE_SPEC = dataclasses.replace(
    MIXTRAL_SPEC, name="qwen3_moe", config_from_dict=qwen3_moe_config, build=build_qwen3_moe,
    transformer_layer_classes=(Qwen3MoeDecoderLayer,), hf_model_types=("qwen3_moe",),
    recompute_modules={**_RECOMPUTE, "Qwen3MoeDecoderLayer": (Qwen3MoeDecoderLayer,)},
    implements=MIXTRAL_SPEC.implements - {"model.sliding_window"}, flops_per_token=qwen3_moe_flops_per_token,
    presets=QWEN3_MOE_PRESETS, parallel_plan=QWEN3_MOE_PLAN, context_parallel=True,
    extras={**MIXTRAL_SPEC.extras, "hf_module_to_nxd": LLAMA_SPEC.extras["hf_module_to_nxd"],
            "hf_param_plan": LLAMA_SPEC.extras["hf_param_plan"], "model_class": Qwen3MoeForCausalLM,
            "config_class": Qwen3MoeConfig},
)
