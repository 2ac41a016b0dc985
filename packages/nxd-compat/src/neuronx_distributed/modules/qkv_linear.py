"""``neuronx_distributed.modules.qkv_linear``: GQAQKVColumnParallelLinear."""

from nxd_compat.surface import not_provided
from nxd_tensor_parallel.modules.qkv_linear import *  # noqa: F403
from nxd_tensor_parallel.modules.qkv_linear import GQAQKVColumnParallelLinear

__all__ = ["GQAQKVColumnParallelLinear"]


__getattr__ = not_provided(__name__, {
    "GQAQKVLinearWithAsyncCommunication": "an internal piece of NxD's own GQAQKVColumnParallelLinear autograd; nxd's "
                                          "layer computes its gradients with torch autograd"})
