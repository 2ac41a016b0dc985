"""``neuronx_distributed.modules.lora``: LoRA on plain and TP layers (nxd-lora)."""

from nxd_lora import *  # noqa: F403
from nxd_lora import LoraConfig, LoraModel

__all__ = ["LoraConfig", "LoraModel"]
