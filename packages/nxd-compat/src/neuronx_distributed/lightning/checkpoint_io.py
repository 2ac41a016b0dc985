"""``neuronx_distributed.lightning.checkpoint_io``: NxD's NeuronCheckpointIO on nxd's Lightning support."""

from nxd_compat.lightning import NeuronCheckpointIO

__all__ = ["NeuronCheckpointIO"]
