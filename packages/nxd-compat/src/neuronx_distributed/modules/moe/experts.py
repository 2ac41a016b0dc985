"""``neuronx_distributed.modules.moe.experts``: NxD's expert computation inside ExpertMLPs. Not provided by nxd-compat; its names
raise NotProvidedError saying what to use."""

from nxd_compat.surface import not_provided

_WHY = "use neuronx_distributed.modules.moe.ExpertMLPs (its mlp_op holds NxD's gate_up_proj / down_proj parameters) inside MoE"
__getattr__ = not_provided(__name__, dict.fromkeys((
    'Experts',
), _WHY))
