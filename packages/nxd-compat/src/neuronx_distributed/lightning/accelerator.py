"""``neuronx_distributed.lightning.accelerator``: NxD's ``NeuronXLAAccelerator`` is not provided;
``NeuronXLAStrategy`` runs on nxd's device (CPU, CUDA or XLA) with Lightning's own accelerators."""

from nxd_compat.surface import not_provided

__getattr__ = not_provided(__name__, {"NeuronXLAAccelerator": "NeuronXLAStrategy picks nxd's device itself; use "
                                      "Lightning's accelerator='auto' (or 'cpu'/'gpu')"})
