"""``neuronx_distributed.parallel_layers.layers``: NxD's arguments, nxd's layers."""

from nxd_compat.surface import not_provided
from nxd_tensor_parallel.parallel_layers.layers import *  # noqa: F403
from nxd_tensor_parallel.parallel_layers.layers import ColumnParallelLinear, ParallelEmbedding, RowParallelLinear

__all__ = ["ColumnParallelLinear", "ParallelEmbedding", "RowParallelLinear"]


_AUTOGRAD = ("an internal piece of NxD's own parallel-linear autograd; nxd's ColumnParallelLinear/RowParallelLinear "
             "compute their gradients with torch autograd over nxd-tensor-parallel's regions")
__getattr__ = not_provided(__name__, {
    "BaseParallelLinear": _AUTOGRAD, "LinearWithAsyncCommunication": _AUTOGRAD,
    "SPMDRank": "NxD's rank holder for SPMD-traced Neuron inference models; nxd does not trace"})
