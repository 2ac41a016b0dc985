"""The Llama 2/3/3.x family (and Mistral: Llama plus a sliding window) on nxd's parallel layers, with
Hugging Face import/export."""

from nxd_models_llama.config import LlamaConfig
from nxd_models_llama.generate import gather_vocab_logits, generate, model_device
from nxd_models_llama.hf_io import collect_hf_state_dict, load_hf_checkpoint, save_hf_checkpoint
from nxd_models_llama.mistral import MistralConfig
from nxd_models_llama.modeling import (
    CausalLMOutput,
    KVCache,
    LlamaAttention,
    LlamaCoreAttention,
    LlamaDecoderLayer,
    LlamaForCausalLM,
    LlamaMLP,
    LlamaModel,
)
from nxd_models_llama.presets import PRESETS, preset
from nxd_models_llama.spec import MISTRAL_SPEC, SPEC, build, flops_per_token

__version__ = "0.1.0"

__all__ = [
    "MISTRAL_SPEC", "PRESETS", "SPEC", "CausalLMOutput", "KVCache", "LlamaAttention", "LlamaConfig", "LlamaCoreAttention",
    "LlamaDecoderLayer", "LlamaForCausalLM", "LlamaMLP", "LlamaModel", "MistralConfig", "build", "collect_hf_state_dict",
    "flops_per_token", "gather_vocab_logits", "generate", "model_device", "load_hf_checkpoint", "preset", "save_hf_checkpoint",
]
