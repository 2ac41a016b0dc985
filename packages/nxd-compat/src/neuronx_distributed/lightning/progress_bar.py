"""``neuronx_distributed.lightning.progress_bar``: NxD's NeuronTQDMProgressBar on nxd's Lightning support."""

from nxd_compat.lightning import NeuronTQDMProgressBar

__all__ = ["NeuronTQDMProgressBar"]
