"""The Mixtral family (Hugging Face ``MixtralForCausalLM``) on nxd's parallel layers and nxd-moe."""

from nxd_models_mixtral.config import MixtralConfig
from nxd_models_mixtral.hf_io import collect_hf_state_dict, load_hf_checkpoint, save_hf_checkpoint
from nxd_models_mixtral.modeling import MixtralDecoderLayer, MixtralForCausalLM, MixtralModel, MoECausalLMOutput
from nxd_models_mixtral.presets import PRESETS, preset
from nxd_models_mixtral.spec import SPEC, build, flops_per_token

__version__ = "0.1.0"

__all__ = [
    "PRESETS", "SPEC", "MixtralConfig", "MixtralDecoderLayer", "MixtralForCausalLM", "MixtralModel",
    "MoECausalLMOutput", "build", "collect_hf_state_dict", "flops_per_token", "load_hf_checkpoint", "preset",
    "save_hf_checkpoint",
]
