"""``neuronx_distributed.modules.moe.moe_config_validator``: NxD's validator of its kernel/inference MoE configs. Not provided by nxd-compat; its names
raise NotProvidedError saying what to use."""

from nxd_compat.surface import not_provided

_WHY = "NxD's Neuron (NKI) kernels and inference path; nxd-moe computes the experts with torch"
__getattr__ = not_provided(__name__, dict.fromkeys((
    'MoeConfigValidator',
), _WHY))
