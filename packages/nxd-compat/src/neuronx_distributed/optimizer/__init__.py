"""``neuronx_distributed.optimizer``: the ZeRO-1 optimizer (nxd-zero1)."""

from nxd_compat.surface import not_provided
from nxd_zero1 import NeuronZero1Optimizer

__all__ = ["NeuronZero1Optimizer"]


__getattr__ = not_provided(__name__, {
    "NeuronEPZero1Optimizer": "NxD's ZeRO-1 variant for expert-parallel MoE; NeuronZero1Optimizer (nxd-zero1) shards "
                              "expert parameters over their own expert-data-parallel group"})
