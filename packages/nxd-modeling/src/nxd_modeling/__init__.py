"""What nxd's model families share: one RoPE, the SDPA mask builder, the causal-LM loss, greedy generation and the Hugging Face import/export pipeline."""

__version__ = "0.1.0"
