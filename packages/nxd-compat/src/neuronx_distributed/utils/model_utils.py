"""``neuronx_distributed.utils.model_utils``: moving a model to the backend's device."""

from typing import Any

import torch

from nxd_compat.surface import not_provided


def move_model_to_device(model: torch.nn.Module, device: Any) -> None:
    """Move ``model`` to ``device`` in place, keeping the TP sharding attributes of its parameters."""
    from nxd_core_parallel.model_init import move_to_device

    move_to_device(model, torch.device(device) if isinstance(device, str) else device)


_TRACING = "NxD's delayed XLA tracing of pipeline stages; nxd-pipeline does not trace"
__getattr__ = not_provided(__name__, {
    "get_delay_tracing": _TRACING, "check_delay_tracing": _TRACING,
    "get_platform_lnc": "the Neuron logical-core count (LNC) of a Trainium platform; nxd is not on one"})
