"""Qwen3 (dense, spec ``qwen3``) and Qwen3-MoE (spec ``qwen3_moe``) on nxd: Llama's attention with
per-head q/k RMSNorm, Mixtral's MoE model with Qwen3's block, Hugging Face import/export."""

from nxd_models_qwen3.config import Qwen3Config, Qwen3MoeConfig
from nxd_models_qwen3.modeling import Qwen3MoeDecoderLayer, Qwen3MoeForCausalLM
from nxd_models_qwen3.presets import QWEN3_MOE_PRESETS, QWEN3_PRESETS
from nxd_models_qwen3.spec import QWEN3_MOE_SPEC, QWEN3_SPEC, build_qwen3, build_qwen3_moe

__version__ = "0.1.0"

__all__ = ["QWEN3_MOE_PRESETS", "QWEN3_MOE_SPEC", "QWEN3_PRESETS", "QWEN3_SPEC", "Qwen3Config", "Qwen3MoeConfig",
           "Qwen3MoeDecoderLayer", "Qwen3MoeForCausalLM", "build_qwen3", "build_qwen3_moe"]
