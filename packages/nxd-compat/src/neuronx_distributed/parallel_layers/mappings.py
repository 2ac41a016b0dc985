"""``neuronx_distributed.parallel_layers.mappings``: autograd-aware TP/SP collectives."""

from nxd_core_parallel.parallel_layers.mappings import *  # noqa: F403
