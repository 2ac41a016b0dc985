"""The ``qwen3`` and ``qwen3_moe`` :class:`nxd.specs.ModelSpec` s. Import/export, generation,
pipeline contract, LoRA's HF plan and the parallel layouts are Llama's (dense) and Mixtral's
(MoE): this module only names them for Qwen3's configs."""

from __future__ import annotations

from typing import Any

from torch import nn

from nxd.parallel import ParallelContext
from nxd.specs import ModelSpec
from nxd_core_parallel.modules.rms_norm import RMSNorm
from nxd_models_llama import LlamaCoreAttention, LlamaDecoderLayer, LlamaForCausalLM, LlamaMLP, generate
from nxd_models_llama import flops_per_token as llama_flops_per_token
from nxd_models_llama import load_hf_checkpoint as load_dense
from nxd_models_llama import save_hf_checkpoint as save_dense
from nxd_models_llama.spec import SPEC as LLAMA_SPEC
from nxd_models_mixtral import load_hf_checkpoint as load_moe
from nxd_models_mixtral import save_hf_checkpoint as save_moe
from nxd_models_mixtral.spec import IMPLEMENTS as MOE_IMPLEMENTS
from nxd_models_qwen3.config import Qwen3Config, Qwen3MoeConfig
from nxd_models_qwen3.modeling import Qwen3MoeDecoderLayer, Qwen3MoeForCausalLM
from nxd_models_qwen3.presets import QWEN3_MOE_PRESETS, QWEN3_PRESETS, preset

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")


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
    return LlamaForCausalLM(cfg, sequence_parallel=bool(nxd_config and nxd_config.get("sequence_parallel")))


def build_qwen3_moe(config: Qwen3MoeConfig | dict, nxd_config: dict | None = None,
                    context: ParallelContext | None = None) -> nn.Module:
    cfg = qwen3_moe_config(config) if isinstance(config, dict) else config
    return Qwen3MoeForCausalLM(cfg, sequence_parallel=bool(nxd_config and nxd_config.get("sequence_parallel")),
                               context=context)


def qwen3_flops_per_token(config: Qwen3Config | dict, seq_length: int | None = None) -> float:
    return llama_flops_per_token(qwen3_config(config) if isinstance(config, dict) else config, seq_length)


def qwen3_moe_flops_per_token(config: Qwen3MoeConfig | dict, seq_length: int | None = None) -> float:
    """``6 x`` the matmul parameters a token touches (attention, router, ``top_k`` experts in MoE
    layers, the dense MLP elsewhere, LM head), plus attention scores when ``seq_length`` is given."""
    c = qwen3_moe_config(config) if isinstance(config, dict) else config
    h, hd = c.hidden_size, c.head_dim
    q, kv = c.num_attention_heads * hd, c.num_key_value_heads * hd
    params = h * c.vocab_size
    for i in range(c.num_hidden_layers):
        params += h * (q + 2 * kv) + q * h
        params += (h * c.num_local_experts + c.num_experts_per_tok * 3 * h * c.moe_intermediate_size
                   if c.is_moe_layer(i) else 3 * h * c.intermediate_size)
    flops = 6.0 * params
    if seq_length:
        flops += 12.0 * c.num_hidden_layers * q * seq_length
    return flops


#: NxD Training's recompute names -> ours
_RECOMPUTE = {"CoreAttention": (LlamaCoreAttention,), "Qwen3RMSNorm": (RMSNorm,)}

QWEN3_SPEC = ModelSpec(
    name="qwen3",
    config_from_dict=qwen3_config,
    build=build_qwen3,
    transformer_layer_classes=(LlamaDecoderLayer,),
    core_attention_classes=(LlamaCoreAttention,),
    recompute_modules={**_RECOMPUTE, "Qwen3MLP": (LlamaMLP,), "Qwen3DecoderLayer": (LlamaDecoderLayer,)},
    hf_model_types=("qwen3",),
    lora_target_modules=LORA_TARGETS,
    load_hf=load_dense,
    save_hf=save_dense,
    flops_per_token=qwen3_flops_per_token,
    generate=generate,
    presets=QWEN3_PRESETS,
    context_parallel=True,  # Llama's ring attention: the q/k norms act per token
    implements=frozenset({"model.fused_kernels"}),
    extras={**LLAMA_SPEC.extras, "model_class": LlamaForCausalLM, "config_class": Qwen3Config},
)

QWEN3_MOE_SPEC = ModelSpec(
    name="qwen3_moe",
    config_from_dict=qwen3_moe_config,
    build=build_qwen3_moe,
    transformer_layer_classes=(Qwen3MoeDecoderLayer,),
    core_attention_classes=(LlamaCoreAttention,),
    recompute_modules={**_RECOMPUTE, "Qwen3MoeDecoderLayer": (Qwen3MoeDecoderLayer,)},
    hf_model_types=("qwen3_moe",),
    implements=MOE_IMPLEMENTS - {"model.sliding_window"},
    lora_target_modules=LORA_TARGETS,
    load_hf=load_moe,
    save_hf=save_moe,
    flops_per_token=qwen3_moe_flops_per_token,
    generate=generate,
    presets=QWEN3_MOE_PRESETS,
    extras={"hf_module_to_nxd": LLAMA_SPEC.extras["hf_module_to_nxd"],
            "hf_param_plan": LLAMA_SPEC.extras["hf_param_plan"],
            "model_class": Qwen3MoeForCausalLM, "config_class": Qwen3MoeConfig, "sequence_dimension": 1},
)
