"""``neuronx_distributed.parallel_layers.layer_norm``: LayerNorm with sequence-parallel tagging."""

from nxd_tensor_parallel.parallel_layers.layer_norm import *  # noqa: F403
