"""``neuronx_distributed.modules.qkv_linear_utils``: NxD's hand-written autograd steps of its GQA
QKV layer. nxd's ``GQAQKVColumnParallelLinear`` uses torch autograd; these internals are not provided."""

from nxd_compat.surface import not_provided

_WHY = ("an internal step of NxD's GQAQKVColumnParallelLinear autograd; nxd's layer "
        "(neuronx_distributed.modules.qkv_linear) computes its gradients with torch autograd")
__getattr__ = not_provided(__name__, {n: _WHY for n in (
    "check_use_bias", "check_requires_grad", "_qkvlinear_autograd_base_setup_fwd", "_qkvlinear_autograd_base_setup_bwd",
    "_qkvlinear_autograd_bwd_grad_reduce", "_qkvlinear_autograd_bwd_no_weight_grad",
    "_qkvlinear_autograd_bwd_input_grad")})
