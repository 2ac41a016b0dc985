"""NxD's ``neuronx_distributed.utils.tensor_replacement``: not provided (importing it says why)."""

from nxd_compat.surface import refuse_module

refuse_module(__name__, "NxD's tensor capture/replacement for debugging traced Neuron inference models; with nxd, register torch forward hooks on the eager model")
