"""``neuronx_distributed.parallel_layers.layers_utils``: NxD's hand-written autograd steps of its
parallel linear layers (weight-gradient reduction overlapped on Neuron). nxd's layers leave their
gradients to torch autograd, so these internals are not provided."""

from nxd_compat.surface import not_provided

_WHY = ("an internal step of NxD's own ColumnParallelLinear/RowParallelLinear autograd; nxd's layers "
        "(neuronx_distributed.parallel_layers.layers) compute their gradients with torch autograd")
__getattr__ = not_provided(__name__, {n: _WHY for n in (
    "_linear_autograd_base_setup_fwd", "_linear_autograd_base_setup_bwd", "_linear_autograd_bwd_grad_reduce",
    "_linear_autograd_bwd_no_weight_grad", "_linear_autograd_bwd_input_grad")})
