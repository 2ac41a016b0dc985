"""The Megatron-LM GPT family on nxd's parallel layers: Hugging Face GPT-2 / GPT-NeoX interop and
Megatron-LM / NeMo checkpoint loading."""

from nxd_models_gpt.config import GPTConfig
from nxd_models_gpt.generate import gather_vocab_logits, generate
from nxd_models_gpt.hf_io import collect_hf_state_dict, load_hf_checkpoint, save_hf_checkpoint
from nxd_models_gpt.megatron_ckpt import (
    config_from_megatron_args,
    load_megatron_checkpoint,
    read_megatron_state_dict,
    save_megatron_checkpoint,
)
from nxd_models_gpt.modeling import (
    GPTMLP,
    CausalLMOutput,
    GPTCoreAttention,
    GPTForCausalLM,
    GPTSelfAttention,
    GPTTransformerLayer,
)
from nxd_models_gpt.presets import PRESETS, preset
from nxd_models_gpt.spec import SPEC, build, flops_per_token

__version__ = "0.1.0"

__all__ = [
    "GPTMLP", "PRESETS", "SPEC", "CausalLMOutput", "GPTConfig", "GPTCoreAttention", "GPTForCausalLM",
    "GPTSelfAttention", "GPTTransformerLayer", "build", "collect_hf_state_dict", "config_from_megatron_args",
    "flops_per_token", "gather_vocab_logits", "generate", "load_hf_checkpoint", "load_megatron_checkpoint", "preset",
    "read_megatron_state_dict", "save_hf_checkpoint", "save_megatron_checkpoint",
]
