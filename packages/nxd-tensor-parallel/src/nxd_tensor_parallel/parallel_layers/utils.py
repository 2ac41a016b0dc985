"""Sharding metadata on parameters, and small helpers."""

from __future__ import annotations

import torch

_TP_ATTRS = {"tensor_model_parallel": False, "partition_dim": -1, "partition_stride": 1}

#: bytes one element of a parameter takes in memory when it is not its dtype's itemsize (a frozen base
#: weight stored quantised: nxd-lora's NF4), set on the parameter; memory planning (nxd plan) reads it
STORED_BYTES_PER_ELEMENT = "stored_bytes_per_element"


def divide(numerator: int, denominator: int, what: str = "size", hint: str | None = None) -> int:
    """``numerator // denominator``, raising a clear error when it does not divide; ``hint`` (the
    route around it) ends the message."""
    if numerator % denominator != 0:
        if hint is None and what == "size":
            # a plain divide() is how NxD models split their heads: name NxD's head-padding route
            hint = ("; for attention heads, size them with parallel_layers.pad.get_number_of_extra_heads and pad the "
                    "model with pad_model (NxD's head padding)")
        raise ValueError(f"{what} {numerator} is not divisible by tensor parallel size {denominator}{hint or ''}")
    return numerator // denominator


def get_padding_length(size: int, tp: int, alignment_per_rank: int = 1) -> int:
    """How many entries ``pad=True`` appends so ``size`` splits into ``tp`` equal shards, each a
    multiple of ``alignment_per_rank`` (NxD's name and rule)."""
    multiple = tp * max(1, int(alignment_per_rank))
    return -size % multiple


def mark_padding(tensor: torch.Tensor, unpadded_size: int, alignment_per_rank: int = 1) -> None:
    """Record that the full tensor holds ``unpadded_size`` real entries along its partition dim and
    zero padding after them: checkpoints and exports keep the real size and re-pad on load."""
    tensor.unpadded_size = int(unpadded_size)
    tensor.pad_alignment_size_per_rank = max(1, int(alignment_per_rank))


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
    for name in (*_TP_ATTRS, "kv_size_multiplier", "fused_splits", "sequence_parallel_enabled", "unpadded_size",
                 "pad_alignment_size_per_rank"):
        if hasattr(source, name):
            setattr(destination, name, getattr(source, name))


def param_is_tensor_parallel(param: torch.Tensor) -> bool:
    return bool(getattr(param, "tensor_model_parallel", False))


def split_tensor_along_last_dim(tensor: torch.Tensor, num_partitions: int, contiguous_split_chunks: bool = False):
    last = tensor.dim() - 1
    chunks = torch.split(tensor, divide(tensor.size(last), num_partitions, "last dimension"), dim=last)
    return tuple(c.contiguous() for c in chunks) if contiguous_split_chunks else chunks
