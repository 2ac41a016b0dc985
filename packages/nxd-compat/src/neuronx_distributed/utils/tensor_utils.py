"""``neuronx_distributed.utils.tensor_utils``: NxD's ``cumsum``."""

import torch


def cumsum(tensor: torch.Tensor, dim: int = 0, tril_size: int = 2048) -> torch.Tensor:
    """NxD's cumulative sum of a 2D tensor along dim 0, summed in float64 and cast back to the input's dtype.
    NxD computes it as blocked matmuls with a ``tril_size`` lower-triangular matrix (for Neuron);
    torch's cumsum in float64 gives the same sums, so ``tril_size`` changes nothing here."""
    if len(tensor.shape) != 2:
        raise ValueError(f"Expected 2D input tensor, unsupported shape: {tensor.shape}")
    if dim != 0:
        raise NotImplementedError(f"Only cumsum along dimension-0 is currently supported, unexpected dim={dim}")
    return torch.cumsum(tensor.to(torch.float64), dim=0).to(tensor.dtype)
