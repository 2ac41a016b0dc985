"""The ``qwen3`` and ``qwen3_moe`` :class:`nxd.specs.ModelSpec` s. Import/export, generation,
pipeline contract, LoRA's HF plan and the parallel layouts are Llama's (dense) and Mixtral's
(MoE): this module only names them for Qwen3's configs."""

from __future__ import annotations

from functools import partial

from nxd.specs import config_reader, family_spec
from nxd_models_llama import LlamaCoreAttention, LlamaDecoderLayer, LlamaForCausalLM, LlamaMLP
from nxd_models_llama import flops_per_token as llama_flops_per_token
from nxd_models_llama.spec import SPEC as LLAMA_SPEC
from nxd_models_mixtral.spec import SPEC as MIXTRAL_SPEC
from nxd_models_mixtral.spec import flops_per_token as mixtral_flops_per_token
from nxd_models_qwen3.config import Qwen3Config, Qwen3MoeConfig
from nxd_models_qwen3.modeling import Qwen3MoeDecoderLayer, Qwen3MoeForCausalLM
from nxd_models_qwen3.presets import QWEN3_MOE_PRESETS, QWEN3_PRESETS, preset
from nxd_tensor_parallel.modules.rms_norm import RMSNorm

#: HF ``config.json`` keys -> :class:`Qwen3Config`; ``{"preset": name, ...}`` starts from a preset
qwen3_config = config_reader(Qwen3Config.from_dict, partial(preset, QWEN3_PRESETS))
#: HF ``config.json`` keys -> :class:`Qwen3MoeConfig`; ``{"preset": name, ...}`` starts from a preset
qwen3_moe_config = config_reader(Qwen3MoeConfig.from_dict, partial(preset, QWEN3_MOE_PRESETS))


def qwen3_flops_per_token(config: Qwen3Config | dict, seq_length: int | None = None) -> float:
    return llama_flops_per_token(qwen3_config(config) if isinstance(config, dict) else config, seq_length)


def qwen3_moe_flops_per_token(config: Qwen3MoeConfig | dict, seq_length: int | None = None) -> float:
    return mixtral_flops_per_token(qwen3_moe_config(config) if isinstance(config, dict) else config, seq_length)


#: NxD Training's recompute names -> ours
_RECOMPUTE = {"CoreAttention": (LlamaCoreAttention,), "Qwen3RMSNorm": (RMSNorm,)}

#: Llama's model (``qk_norm`` on) and spec (HF import/export, generate, LoRA plan, CP) for Qwen3's configs
QWEN3_SPEC = family_spec(
    "qwen3", LlamaForCausalLM, qwen3_config, base=LLAMA_SPEC, hf_model_types=("qwen3",),
    recompute_modules={**_RECOMPUTE, "Qwen3MLP": (LlamaMLP,), "Qwen3DecoderLayer": (LlamaDecoderLayer,)},
    flops_per_token=qwen3_flops_per_token, presets=QWEN3_PRESETS, extras={"config_class": Qwen3Config},
)

#: Mixtral's spec (MoE model, HF import/export by the config's names, generate) for Qwen3-MoE, plus
#: Llama's LoRA plan for the attention projections
QWEN3_MOE_SPEC = family_spec(
    "qwen3_moe", Qwen3MoeForCausalLM, qwen3_moe_config, base=MIXTRAL_SPEC, hf_model_types=("qwen3_moe",),
    recompute_modules={**_RECOMPUTE, "Qwen3MoeDecoderLayer": (Qwen3MoeDecoderLayer,)},
    implements=MIXTRAL_SPEC.implements - {"model.sliding_window"}, flops_per_token=qwen3_moe_flops_per_token,
    presets=QWEN3_MOE_PRESETS,
    extras={"hf_module_to_nxd": LLAMA_SPEC.extras["hf_module_to_nxd"],
            "hf_param_plan": LLAMA_SPEC.extras["hf_param_plan"], "config_class": Qwen3MoeConfig},
)
#: the plain model (``(config, device)``); the transform list (``nxd.build_parallel_model``) parallelises them
build_qwen3 = QWEN3_SPEC.build
build_qwen3_moe = QWEN3_MOE_SPEC.build
