"""``neuronx_distributed.modules.lora.config``: ``LoraConfig`` (nxd-lora)."""

from nxd_lora import LoraConfig

__all__ = ["LoraConfig"]
