"""``neuronx_distributed.modules.lora``: LoRA on plain and TP layers (nxd-lora) with NxD's ``LoraModel``."""

from typing import Any

from torch import nn

from nxd_lora import *  # noqa: F403
from nxd_lora import LoraConfig

# isort: split
# after the star import, which brings nxd-lora's alias: NxD's class
from neuronx_distributed.modules.lora.model import LoraModel

__all__ = ["LoraConfig", "LoraModel", "get_lora_model"]


def get_lora_model(model: nn.Module, lora_config: LoraConfig | None) -> Any:
    """NxD's helper: ``model`` with LoRA adapters (an ``NxDModel``'s inner module wrapped in place)."""
    if lora_config is None:
        return model
    from neuronx_distributed.trainer.model import NxDModel

    if isinstance(model, NxDModel):
        model.module = LoraModel(model.module, lora_config)
        return model
    return LoraModel(model, lora_config)
