"""``neuronx_distributed.modules.moe.experts``: NxD's expert computation inside ExpertMLPs; not provided by nxd-compat (its
names raise NotProvidedError saying what to use: ``_not_provided``)."""

from neuronx_distributed.modules.moe._not_provided import module_getattr

__getattr__ = module_getattr(__name__)
