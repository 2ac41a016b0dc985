"""``neuronx_distributed.modules.moe.expert_mlps_v2``: NxD's inference expert MLPs. Not provided by nxd-compat; its names
raise NotProvidedError saying what to use."""

from nxd_compat.surface import not_provided

_WHY = "NxD's inference ExpertMLPsV2 (RoutedExpertsMLPOpsConfig, kernels); training uses neuronx_distributed.modules.moe.ExpertMLPs"
__getattr__ = not_provided(__name__, dict.fromkeys((
    'ExpertMLPsV2', 'create_spmd_ranks', 'duplicate_and_replace_prefixes', 'can_use_find_index_kernel',
), _WHY))
