"""``neuronx_distributed.modules.moe.moe_config_validator``: NxD's validator of its kernel/inference MoE configs; not provided by nxd-compat (its
names raise NotProvidedError saying what to use: ``_not_provided``)."""

from neuronx_distributed.modules.moe._not_provided import module_getattr

__getattr__ = module_getattr(__name__)
