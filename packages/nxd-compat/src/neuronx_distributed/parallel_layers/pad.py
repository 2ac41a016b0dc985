"""``neuronx_distributed.parallel_layers.pad``: attention-head padding (NxD's ``pad_model``,
``generate_padding_mask``), from nxd-core-parallel."""

from typing import Any

import torch

from neuronx_distributed.utils.utils import hardware
from nxd_tensor_parallel.parallel_layers import pad as _pad
from nxd_tensor_parallel.parallel_layers.pad import get_number_of_extra_heads, pad_model

__all__ = ["generate_padding_mask", "get_number_of_extra_heads", "pad_model"]


def generate_padding_mask(num_heads: int, num_heads_with_pad: int, num_kv_heads: int, tp_degree: int, tp_rank: int,
                          hardware_type: Any = None) -> torch.Tensor:
    """NxD's signature. ``hardware(get_platform_target())`` is ``hardware.CUSTOM`` on nxd, which
    means nxd's own KV layout (NxD's trn2 one)."""
    if hardware_type is hardware.CUSTOM:
        hardware_type = None
    return _pad.generate_padding_mask(num_heads, num_heads_with_pad, num_kv_heads, tp_degree, tp_rank, hardware_type)
