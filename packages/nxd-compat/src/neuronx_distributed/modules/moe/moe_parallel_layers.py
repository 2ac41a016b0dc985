"""``neuronx_distributed.modules.moe.moe_parallel_layers``: NxD's expert-fused parallel linear layers. Not provided by nxd-compat; its names
raise NotProvidedError saying what to use."""

from nxd_compat.surface import not_provided

_WHY = "neuronx_distributed.modules.moe.ExpertMLPs holds their parameters in NxD's layouts (mlp_op.gate_up_proj.weight [E_local, H, 2I/tp], mlp_op.down_proj.weight [E_local, I/tp, H]); nxd-moe computes with them"
__getattr__ = not_provided(__name__, dict.fromkeys((
    'ExpertFusedLinearWithAsyncCommunication', 'ExpertFusedLinear', 'ExpertFusedColumnParallelLinear',
    'ExpertFusedRowParallelLinear',
), _WHY))
