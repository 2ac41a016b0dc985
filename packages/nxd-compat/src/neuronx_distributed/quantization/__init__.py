"""NxD's ``neuronx_distributed.quantization``: not provided (importing it says why)."""

from nxd_compat.surface import refuse_module

refuse_module(__name__, "NxD's weight quantization for Neuron inference (quantized parallel layers, observers, MX formats); nxd's low precision for training is nxd-fp8 (torchao)")
