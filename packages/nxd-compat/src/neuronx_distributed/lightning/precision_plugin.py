"""``neuronx_distributed.lightning.precision_plugin``: NxD's NeuronXLAPrecisionPlugin on nxd's Lightning support."""

from nxd_compat.lightning import NeuronXLAPrecisionPlugin

__all__ = ["NeuronXLAPrecisionPlugin"]
