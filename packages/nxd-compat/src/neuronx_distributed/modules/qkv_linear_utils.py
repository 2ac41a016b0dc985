"""``neuronx_distributed.modules.qkv_linear_utils``: NxD's hand-written autograd steps of its GQA
QKV layer. nxd's ``GQAQKVColumnParallelLinear`` uses torch autograd: those internals are not
provided; NxD's two plain checks are."""

from typing import Any

from nxd_compat.surface import not_provided


def check_requires_grad(weight_qkv: Any, fuse_qkv: bool, weight_q: Any) -> bool:
    """Whether the layer's (fused or query) weight trains."""
    return weight_qkv.requires_grad if fuse_qkv else weight_q.requires_grad


def check_use_bias(weight_qkv: Any, fuse_qkv: bool, weight_q: Any, bias_q: Any, bias_qkv: Any) -> bool:
    """Whether the layer has a (fused or query) bias and its weight trains."""
    has_bias = bias_qkv is not None if fuse_qkv else bias_q is not None
    return has_bias and check_requires_grad(weight_qkv, fuse_qkv, weight_q)


_WHY = ("an internal step of NxD's GQAQKVColumnParallelLinear autograd; nxd's layer "
        "(neuronx_distributed.modules.qkv_linear) computes its gradients with torch autograd")
__getattr__ = not_provided(__name__, {n: _WHY for n in (
    "_qkvlinear_autograd_base_setup_fwd", "_qkvlinear_autograd_base_setup_bwd", "_qkvlinear_autograd_bwd_grad_reduce",
    "_qkvlinear_autograd_bwd_no_weight_grad", "_qkvlinear_autograd_bwd_input_grad")})
