"""``neuronx_distributed.modules.moe.moe_fused_tkg``: NxD's fused token-generation MoE kernel (inference); not provided by nxd-compat (its
names raise NotProvidedError saying what to use: ``_not_provided``)."""

from neuronx_distributed.modules.moe._not_provided import module_getattr

__getattr__ = module_getattr(__name__)
