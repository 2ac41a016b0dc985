"""``neuronx_distributed.parallel_layers.random``: model-parallel seeding and the RNG tracker."""

from nxd_core_parallel.random import *  # noqa: F403
