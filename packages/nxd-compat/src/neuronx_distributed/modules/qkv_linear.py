"""``neuronx_distributed.modules.qkv_linear``: GQAQKVColumnParallelLinear."""

from nxd_core_parallel.modules.qkv_linear import *  # noqa: F403
from nxd_core_parallel.modules.qkv_linear import GQAQKVColumnParallelLinear

__all__ = ["GQAQKVColumnParallelLinear"]
