"""``neuronx_distributed.modules.lora.model``: ``LoraModel`` (nxd-lora)."""

from nxd_lora import LoraModel

__all__ = ["LoraModel"]
