"""``neuronx_distributed.parallel_layers.loss_functions``: vocab-parallel cross entropy."""

from nxd_tensor_parallel.parallel_layers.loss_functions import *  # noqa: F403
