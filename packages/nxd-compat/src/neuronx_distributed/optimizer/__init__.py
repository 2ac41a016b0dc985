"""``neuronx_distributed.optimizer``: the ZeRO-1 optimizer (nxd-zero1)."""

from nxd_zero1 import NeuronZero1Optimizer

__all__ = ["NeuronZero1Optimizer"]
