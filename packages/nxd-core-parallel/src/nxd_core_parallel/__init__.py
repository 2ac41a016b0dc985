"""Backends (cpu/gloo, cuda/nccl, xla), parallel state, tensor/sequence/data parallel layers, grad clipping, activation checkpointing, and NxD's model/optimizer wrappers."""

__version__ = "0.1.0"
