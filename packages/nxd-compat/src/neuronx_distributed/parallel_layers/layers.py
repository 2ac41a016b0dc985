"""``neuronx_distributed.parallel_layers.layers``: NxD's arguments, nxd's layers."""

from nxd_core_parallel.parallel_layers.layers import *  # noqa: F403
from nxd_core_parallel.parallel_layers.layers import ColumnParallelLinear, ParallelEmbedding, RowParallelLinear

__all__ = ["ColumnParallelLinear", "ParallelEmbedding", "RowParallelLinear"]
