"""``neuronx_distributed.lightning.strategy``: NxD's NeuronXLAStrategy on nxd's Lightning support."""

from nxd_compat.lightning import NeuronXLAStrategy

__all__ = ["NeuronXLAStrategy"]
