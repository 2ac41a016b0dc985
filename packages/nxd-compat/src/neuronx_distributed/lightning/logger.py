"""``neuronx_distributed.lightning.logger``: NxD's NeuronTensorBoardLogger on nxd's Lightning support."""

from nxd_compat.lightning import NeuronTensorBoardLogger

__all__ = ["NeuronTensorBoardLogger"]
