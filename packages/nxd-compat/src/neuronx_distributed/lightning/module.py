"""``neuronx_distributed.lightning.module``: NxD's NeuronLTModule on nxd's Lightning support."""

from nxd_compat.lightning import NeuronLTModule

__all__ = ["NeuronLTModule"]
