"""The parallel runtime: backends, the parallel context and NxD's parallel_state facade, grad sync and clipping, activation checkpointing, meta-device init, and NxD's model/optimizer wrappers."""

__version__ = "0.1.0"
