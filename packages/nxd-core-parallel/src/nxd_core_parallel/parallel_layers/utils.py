"""Sharding metadata on parameters, and small helpers."""

from __future__ import annotations

import torch

_TP_ATTRS = {"tensor_model_parallel": False, "partition_dim": -1, "partition_stride": 1}


def divide(numerator: int, denominator: int, what: str = "size") -> int:
    """``numerator // denominator``, raising a clear error when it does not divide."""
    if numerator % denominator != 0:
        raise ValueError(f"{what} {numerator} is not divisible by tensor parallel size {denominator}")
    return numerator // denominator


def set_tensor_model_parallel_attributes(tensor: torch.Tensor, is_parallel: bool, dim: int, stride: int = 1) -> None:
    """Tag ``tensor`` as (not) sharded over TP along ``dim`` (checkpoint resharding and LoRA read these)."""
    tensor.tensor_model_parallel = bool(is_parallel)
    tensor.partition_dim = int(dim)
    tensor.partition_stride = int(stride)


def set_defaults_if_not_set_tensor_model_parallel_attributes(tensor: torch.Tensor) -> None:
    for name, value in _TP_ATTRS.items():
        if not hasattr(tensor, name):
            setattr(tensor, name, value)


def copy_tensor_model_parallel_attributes(destination: torch.Tensor, source: torch.Tensor) -> None:
    for name in (*_TP_ATTRS, "kv_size_multiplier", "fused_splits", "sequence_parallel_enabled"):
        if hasattr(source, name):
            setattr(destination, name, getattr(source, name))


def param_is_tensor_parallel(param: torch.Tensor) -> bool:
    return bool(getattr(param, "tensor_model_parallel", False))


def split_tensor_along_last_dim(tensor: torch.Tensor, num_partitions: int, contiguous_split_chunks: bool = False):
    last = tensor.dim() - 1
    chunks = torch.split(tensor, divide(tensor.size(last), num_partitions, "last dimension"), dim=last)
    return tuple(c.contiguous() for c in chunks) if contiguous_split_chunks else chunks
