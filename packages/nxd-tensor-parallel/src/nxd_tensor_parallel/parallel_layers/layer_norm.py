"""LayerNorm whose parameters are tagged for the sequence-parallel gradient all-reduce."""

from __future__ import annotations

from typing import Optional, Union

import torch
from torch import nn

from nxd_tensor_parallel.parallel_layers.utils import set_tensor_model_parallel_attributes


class LayerNorm(nn.LayerNorm):
    """``torch.nn.LayerNorm`` (same math, same state-dict keys) whose ``weight`` and ``bias`` are
    replicated over TP and carry ``sequence_parallel_enabled``. Under sequence parallelism each TP
    rank normalises only its slice of the sequence, so its gradients are partial sums;
    ``NxDOptimizer.step`` all-reduces the tagged ones over TP."""

    def __init__(self, normalized_shape: Union[int, list[int], torch.Size], eps: float = 1e-5,
                 elementwise_affine: bool = True, bias: bool = True, sequence_parallel_enabled: bool = False,
                 dtype: torch.dtype = torch.float32, device: Optional[torch.device] = None) -> None:
        super().__init__(normalized_shape, eps=eps, elementwise_affine=elementwise_affine, bias=bias,
                         device=device, dtype=dtype)
        self.sequence_parallel_enabled = sequence_parallel_enabled
        for param in (self.weight, self.bias):
            if param is not None:
                set_tensor_model_parallel_attributes(param, False, -1, 1)
                param.sequence_parallel_enabled = sequence_parallel_enabled

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, sequence_parallel={self.sequence_parallel_enabled}"
