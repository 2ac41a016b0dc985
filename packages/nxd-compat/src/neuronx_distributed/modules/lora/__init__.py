"""``neuronx_distributed.modules.lora``: LoRA on plain and TP layers (nxd-lora)."""

from nxd_lora import *  # noqa: F403
from nxd_lora import LoraConfig

# isort: split
# after the star import, which brings nxd-lora's alias: NxD's class name
from neuronx_distributed.modules.lora.model import LoraModel

__all__ = ["LoraConfig", "LoraModel"]
