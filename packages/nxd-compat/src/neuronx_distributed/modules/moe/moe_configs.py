"""``neuronx_distributed.modules.moe.moe_configs``: NxD's config dataclasses for its Neuron MoE
kernels and inference (blockwise matmul, fused token generation). Not provided: nxd-moe's layer is
configured by ``nxd_moe.MoEConfig`` and ``MoE``'s arguments."""

from nxd_compat.surface import not_provided

_USE = "configure MoE(router, expert_mlps) / nxd_moe.MoEConfig; NxD's Neuron-kernel and inference configs do not apply"
__getattr__ = not_provided(__name__, {n: _USE for n in (
    "to_torch_dtype", "BlockwiseMatmulConfig", "RoutedExpertsMLPOpsConfig", "RouterConfig", "MoEFusedTKGConfig")})
