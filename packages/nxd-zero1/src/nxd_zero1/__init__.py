"""ZeRO-1 optimizer with fp32 master weights and bf16 stochastic rounding."""

from nxd_zero1.optimizer import NeuronZero1Optimizer
from nxd_zero1.rounding import stochastic_round_to_bf16

__all__ = ["NeuronZero1Optimizer", "stochastic_round_to_bf16"]
__version__ = "0.1.0"
