"""``neuronx_distributed.lightning.neuron_hooks_callback``: NxD's NeuronHooksCallback on nxd's Lightning support."""

from nxd_compat.lightning import NeuronHooksCallback

__all__ = ["NeuronHooksCallback"]
