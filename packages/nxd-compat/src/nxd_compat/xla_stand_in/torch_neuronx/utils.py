"""torch_neuronx.utils (nxd-compat stand-in): the platform is not a Neuron one."""

from neuronx_distributed.utils.utils import get_platform_target

__all__ = ["get_platform_target"]
