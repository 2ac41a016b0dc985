"""``neuronx_distributed.utils.model_utils``: moving a model to the backend's device."""

from typing import Any

import torch


def move_model_to_device(model: torch.nn.Module, device: Any) -> None:
    """Move ``model`` to ``device`` in place, keeping the TP sharding attributes of its parameters."""
    from nxd_core_parallel.model_init import move_to_device

    move_to_device(model, torch.device(device) if isinstance(device, str) else device)
