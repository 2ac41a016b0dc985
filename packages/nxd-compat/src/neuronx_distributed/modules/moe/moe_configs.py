"""``neuronx_distributed.modules.moe.moe_configs``: NxD's MoE config classes.

``to_torch_dtype`` and ``RouterConfig`` (a router's activation and dtype) are vendored from
aws-neuron/neuronx-distributed (Apache-2.0), ``src/neuronx_distributed/modules/moe/moe_configs.py``
at commit fbac349 (Release 2.29). The configs of NxD's Neuron kernels and inference (blockwise
matmul, fused token generation) are not provided: nxd-moe's layer is configured by
``nxd_moe.MoEConfig`` and ``MoE``'s arguments."""

from typing import Optional, Union

import torch

from nxd_compat.surface import not_provided

__all__ = ["RouterConfig", "to_torch_dtype"]


def to_torch_dtype(dtype_str: str) -> torch.dtype:
    dtype_mapping = {
        "float32": torch.float32,
        "float16": torch.float16,
        "bfloat16": torch.bfloat16,
    }
    assert dtype_str in dtype_mapping, f"Unsupported dtype: {dtype_str}"
    return dtype_mapping[dtype_str]


class RouterConfig:
    """
    Configuration for router
    Arguments:
        act_fn: Activation function. See ACT2FN for supported activations.
        dtype: Router dtype
    """

    def __init__(self, act_fn: str = "softmax", dtype: Optional[Union[torch.dtype, str]] = torch.float32):
        self.act_fn = act_fn
        if isinstance(dtype, str):
            dtype = to_torch_dtype(dtype)
        self.dtype = dtype

    @staticmethod
    def from_kwargs(**kwargs):
        act_fn = kwargs.pop("router_act_fn", "softmax")
        dtype = kwargs.pop("router_dtype", torch.float32)
        return RouterConfig(act_fn=act_fn, dtype=dtype)


_USE = "configure MoE(router, expert_mlps) / nxd_moe.MoEConfig; NxD's Neuron-kernel and inference configs do not apply"
__getattr__ = not_provided(__name__, {n: _USE for n in (
    "BlockwiseMatmulConfig", "RoutedExpertsMLPOpsConfig", "MoEFusedTKGConfig")})
