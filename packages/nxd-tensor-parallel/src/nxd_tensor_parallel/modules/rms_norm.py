"""RMSNorm whose weight is tagged for the sequence-parallel gradient all-reduce."""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from nxd_tensor_parallel.parallel_layers.utils import set_tensor_model_parallel_attributes


class RMSNorm(nn.Module):
    """``weight * x / sqrt(mean(x^2) + eps)``, computed in fp32 (as Llama does)."""

    def __init__(self, hidden_size: int, eps: float = 1e-6, sequence_parallel_enabled: bool = False,
                 dtype: torch.dtype = torch.float32, device: Optional[torch.device] = None,
                 fused: bool = False) -> None:
        super().__init__()
        self.hidden_size, self.eps = hidden_size, eps
        #: run Liger-Kernel's fused RMSNorm (CUDA; nxd_tensor_parallel.fused_kernels) instead of the eager ops
        self.fused = fused
        self.weight = nn.Parameter(torch.empty(hidden_size, dtype=dtype, device=device))
        self.reset_parameters()
        set_tensor_model_parallel_attributes(self.weight, False, -1, 1)  # replicated over TP
        self.weight.sequence_parallel_enabled = sequence_parallel_enabled
        self.sequence_parallel_enabled = sequence_parallel_enabled

    def reset_parameters(self) -> None:
        if not self.weight.is_meta:
            with torch.no_grad():
                self.weight.fill_(1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused:
            from nxd_tensor_parallel.fused_kernels import rms_norm

            return rms_norm(x, self.weight, self.eps)
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)

    def extra_repr(self) -> str:
        fused = ", fused=True" if self.fused else ""
        return f"{self.hidden_size}, eps={self.eps}, sequence_parallel={self.sequence_parallel_enabled}{fused}"
