"""``neuronx_distributed.parallel_layers.grads``: gradient norm and clipping across TP/PP/DP."""

from nxd_core_parallel.grads import *  # noqa: F403
