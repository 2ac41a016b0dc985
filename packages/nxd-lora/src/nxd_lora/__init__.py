"""LoRA on plain and tensor-parallel layers with PEFT-compatible safetensors adapters."""

from nxd_lora.config import LoraConfig
from nxd_lora.layers import LoraAdapter, LoraPiece
from nxd_lora.model import LoRAModel, get_lora_model
from nxd_lora.peft_format import collect_adapter_state_dict, load_adapter, read_peft_config, save_adapter

LoraModel = LoRAModel  # NxD spells it both ways

__version__ = "0.1.0"

__all__ = [
    "LoRAModel", "LoraAdapter", "LoraConfig", "LoraModel", "LoraPiece", "collect_adapter_state_dict",
    "get_lora_model", "load_adapter", "read_peft_config", "save_adapter",
]
