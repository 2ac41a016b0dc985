"""The ``llama`` :class:`nxd.specs.ModelSpec`."""

from __future__ import annotations

from typing import Any

from nxd.errors import ConfigError
from nxd.specs import config_reader, family_spec
from nxd_models_llama.config import LlamaConfig
from nxd_models_llama.generate import generate
from nxd_models_llama.hf_io import load_hf_checkpoint, save_hf_checkpoint
from nxd_models_llama.hf_mapping import HF_KEY_MAPPING, HF_MODULE_TO_NXD, plan_for
from nxd_models_llama.mistral import PRESETS as MISTRAL_PRESETS
from nxd_models_llama.mistral import MistralConfig
from nxd_models_llama.mistral import preset as mistral_preset
from nxd_models_llama.modeling import (
    LlamaActivationMultiply,
    LlamaCoreAttention,
    LlamaDecoderLayer,
    LlamaForCausalLM,
    LlamaMLP,
    kv_size_multiplier_for,
)
from nxd_models_llama.presets import PRESETS
from nxd_tensor_parallel.modules.rms_norm import RMSNorm

#: NxD Training's selective-recompute names (its HF Llama module classes) -> ours
RECOMPUTE_MODULES: dict[str, tuple[type, ...]] = {
    "CoreAttention": (LlamaCoreAttention,),
    "LlamaMLP": (LlamaMLP,),
    "LlamaRMSNorm": (RMSNorm,),
    "ActivationMultiplyMLP": (LlamaActivationMultiply,),
    "LlamaDecoderLayer": (LlamaDecoderLayer,),
}

#: Attention projections, as in NxDT's LoRA recipes (which target the fused ``qkv_proj``) plus o_proj.
DEFAULT_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")


def _preset(name: str, **overrides: Any) -> dict[str, Any]:
    from nxd_models_llama.presets import preset

    return preset(name, **overrides)


#: nxd or Hugging Face ``config.json`` keys -> :class:`LlamaConfig`; ``{"preset": name, ...}`` starts
#: from a preset and overrides it
config_from_dict = config_reader(LlamaConfig.from_dict, _preset)


def flops_per_token(config: LlamaConfig | dict, seq_length: int | None = None) -> float:
    """Training FLOPs per token: ``6 * matmul parameters`` (forward + backward), plus the attention
    score/value products ``12 * layers * heads * head_dim * seq_length`` when ``seq_length`` is given."""
    c = config_from_dict(config) if isinstance(config, dict) else config
    h, hd = c.hidden_size, c.head_dim
    q, kv = c.num_attention_heads * hd, c.num_key_value_heads * hd
    per_layer = h * (q + 2 * kv) + q * h + 3 * h * c.intermediate_size
    matmul_params = c.num_hidden_layers * per_layer + h * c.vocab_size
    flops = 6.0 * matmul_params
    if seq_length:
        flops += 12.0 * c.num_hidden_layers * q * seq_length
    return flops


def hf_param_plan(model: LlamaForCausalLM, name: str, tp: int, rank: int) -> list[tuple[str, int | None, tuple[int, ...]]]:
    """Published as ``extras["hf_param_plan"]`` (nxd-lora reads it): the HF tensors whose rows
    (``dim=0``), columns (``dim=1``) or whole (``dim=None``) make up parameter ``name`` (an nxd
    name, e.g. ``model.layers.0.self_attn.qkv_proj.weight_qkv``) on TP ``rank`` of ``tp``, in local order."""
    multiplier = kv_size_multiplier_for(model.config, tp)
    pieces = plan_for(name, model.config, tp, rank, multiplier)
    if "self_attn" in name and any(p.zeros for p in pieces):  # the triples cannot say where padded heads sit
        raise ConfigError(f"{name}: its attention heads are padded at tensor_parallel_size {tp} (TP does not divide "
                          f"num_attention_heads={model.config.num_attention_heads}), which LoRA adapters on it do "
                          "not cover; choose a tensor_parallel_size dividing the query heads")
    return [(p.hf_key, p.dim, tuple(p.index)) for p in pieces]


SPEC = family_spec(
    "llama", LlamaForCausalLM, config_from_dict,
    recompute_modules=RECOMPUTE_MODULES,
    hf_model_types=("llama",),
    lora_target_modules=DEFAULT_LORA_TARGETS,
    load_hf=load_hf_checkpoint,
    save_hf=save_hf_checkpoint,
    flops_per_token=flops_per_token,
    generate=generate,
    presets=PRESETS,
    implements=frozenset({"model.fused_kernels"}),
    extras={
        "hf_key_mapping": HF_KEY_MAPPING,
        "hf_module_to_nxd": HF_MODULE_TO_NXD,
        "hf_param_plan": hf_param_plan,
        "config_class": LlamaConfig,
        "sequence_dimension": 1,
    },
)
#: the plain model (``(config, device)``); the transform list
#: (``nxd.build_parallel_model``) parallelises it
build = SPEC.build

#: HF ``config.json`` keys -> :class:`MistralConfig`; ``{"preset": name, ...}`` starts from a preset
mistral_config = config_reader(MistralConfig.from_dict, mistral_preset)


def mistral_flops_per_token(config: MistralConfig | dict, seq_length: int | None = None) -> float:
    """Llama's count (attention products over the whole sequence, an upper bound under a window)."""
    return flops_per_token(mistral_config(config) if isinstance(config, dict) else config, seq_length)


#: Llama's model, whose mask applies the config's sliding window, and spec (HF import/export,
#: generate, LoRA plan) for Mistral's configs
MISTRAL_SPEC = family_spec(
    "mistral", LlamaForCausalLM, mistral_config, base=SPEC, hf_model_types=("mistral",),
    recompute_modules={**RECOMPUTE_MODULES, "MistralMLP": (LlamaMLP,), "MistralRMSNorm": (RMSNorm,),
                       "MistralDecoderLayer": (LlamaDecoderLayer,)},
    implements=SPEC.implements | {"model.sliding_window"}, flops_per_token=mistral_flops_per_token,
    presets=MISTRAL_PRESETS, extras={"config_class": MistralConfig},
)
