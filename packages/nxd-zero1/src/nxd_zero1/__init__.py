"""ZeRO-1 optimizer with fp32 master weights and bf16 stochastic rounding."""

__version__ = "0.1.0"
