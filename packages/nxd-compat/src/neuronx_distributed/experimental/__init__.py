"""NxD's ``neuronx_distributed.experimental``: not provided (importing it says why)."""

from nxd_compat.surface import refuse_module

refuse_module(__name__, "NxD's experimental MX (microscaling) kernels and formats for Neuron; nxd's low precision for training is nxd-fp8 (torchao)")
