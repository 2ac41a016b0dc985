"""``neuronx_distributed.modules.moe.moe_process_group``: NxD's inference MoE TP/EP process groups. Not provided by nxd-compat; its names
raise NotProvidedError saying what to use."""

from nxd_compat.surface import not_provided

_WHY = "NxD's inference MoE groups; training's expert-parallel groups come from initialize_model_parallel(expert_model_parallel_size=...) / the nxd config"
__getattr__ = not_provided(__name__, dict.fromkeys((
    'init_tensor_expert_parallel_moe_process_groups', 'get_moe_tp_ep_group', 'get_moe_ep_group',
    'destroy_moe_model_parallel',
), _WHY))
