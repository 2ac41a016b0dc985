"""``neuronx_distributed.parallel_layers.utils``: sharding attributes and small helpers.

nxd-tensor-parallel's helpers, with NxD's signatures where they differ, and NxD's other public
helpers of this module (casts, splits, ``EmbeddingUtility``, ...) as NxD defines them."""

from __future__ import annotations

import collections.abc
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from neuronx_distributed.utils.logger import get_logger
from nxd_compat.surface import NotProvidedError
from nxd_tensor_parallel.parallel_layers import utils as _core
from nxd_tensor_parallel.parallel_layers.utils import *  # noqa: F403
from nxd_tensor_parallel.parallel_layers.utils import divide

logger = get_logger()


def requires_init_pg_override() -> bool:
    """NxD: whether ``init_process_group("xla")`` needs torch-xla's ``pjrt://`` init method (torch
    2.0 only). nxd's torch is newer: False, the plain ``init_process_group`` call is taken."""
    return False


def get_local_world_size() -> int:
    """Processes on this host: torchrun's ``LOCAL_WORLD_SIZE``, else the whole world (one host)."""
    if "LOCAL_WORLD_SIZE" in os.environ:
        return int(os.environ["LOCAL_WORLD_SIZE"])
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def set_tensor_model_parallel_attributes(tensor: torch.Tensor, is_parallel: bool, dim: int, stride: int,
                                         num_partitions: int = -1, rank_ordering: list | None = None) -> None:
    """NxD's signature. ``num_partitions`` is recorded (nxd shards over the TP group); a
    ``rank_ordering`` (NxD's permuted shard placement) is refused."""
    if rank_ordering is not None and list(rank_ordering) != sorted(rank_ordering):
        raise NotProvidedError("set_tensor_model_parallel_attributes(rank_ordering=...): NxD's permuted shard "
                               "placement is not provided by nxd-compat; shards follow TP rank order")
    _core.set_tensor_model_parallel_attributes(tensor, is_parallel, dim, stride)
    if num_partitions != -1:
        tensor.num_partitions = num_partitions


class EmbeddingUtility:
    """NxD's vocabulary ranges: rank ``r`` of ``world_size`` holds ``[first, last)``."""

    @staticmethod
    def range_from_per_partition_vocab_size(per_partition_vocab_size: int, rank: int,
                                            world_size: int) -> Sequence[int]:
        first = rank * per_partition_vocab_size
        return first, first + per_partition_vocab_size

    @staticmethod
    def range_from_global_vocab_size(global_vocab_size: int, rank: int, world_size: int) -> Sequence[int]:
        per_partition = divide(global_vocab_size, world_size, "vocabulary size")
        return EmbeddingUtility.range_from_per_partition_vocab_size(per_partition, rank, world_size)


def param_is_not_tensor_parallel_duplicate(param: torch.Tensor) -> bool:
    from nxd_core_parallel.parallel_state import get_tensor_model_parallel_rank

    return bool(getattr(param, "tensor_model_parallel", False)) or get_tensor_model_parallel_rank() == 0


def ensure_divisibility(numerator: int, denominator: int) -> None:
    divide(numerator, denominator)


def split_tensor_along_dim(tensor: torch.Tensor, dim: int, num_partitions: int,
                           contiguous_split_chunks: bool = False) -> Sequence[torch.Tensor]:
    chunks = list(torch.split(tensor, divide(tensor.size(dim), num_partitions, f"dimension {dim}"), dim=dim))
    return tuple(c.contiguous() for c in chunks) if contiguous_split_chunks else chunks


def split_tensor_along_second_dim(tensor: torch.Tensor, num_partitions: int,
                                  contiguous_split_chunks: bool = False) -> Sequence[torch.Tensor]:
    return split_tensor_along_dim(tensor, 1, num_partitions, contiguous_split_chunks)


def indices_split_along_dim(tensor: torch.Tensor | None, dim: int, rank: int, num_partitions: int) -> torch.Tensor | None:
    """The indices of ``rank``'s contiguous partition of ``tensor`` along ``dim``."""
    if tensor is None:
        return None
    size = divide(tensor.size(dim), num_partitions, f"dimension {dim}")
    return torch.arange(size, device=tensor.device) + rank * size


def is_torch_version_greater_than_2() -> bool:
    return int(torch.__version__.split(".")[0]) >= 2


def is_pjrt_device() -> bool:
    return os.environ.get("PJRT_DEVICE") == "NEURON"


def cast_tensor(tensor: torch.Tensor, from_dtype: torch.dtype = torch.float32,
                to_dtype: torch.dtype = torch.bfloat16) -> Any:
    return tensor.to(dtype=to_dtype) if tensor.dtype == from_dtype else tensor


def cast_all(state: Any, from_dtype: torch.dtype = torch.float32, to_dtype: torch.dtype = torch.bfloat16) -> Any:
    """Tensors (in dicts, lists, tuples) of ``from_dtype`` cast to ``to_dtype``; the rest as is."""
    if isinstance(state, torch.Tensor):
        return cast_tensor(state, from_dtype, to_dtype)
    if isinstance(state, dict):
        return {k: cast_all(v, from_dtype, to_dtype) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(cast_all(x, from_dtype, to_dtype) for x in state)
    return state


def _autocast_dtype() -> torch.dtype:
    device = "cuda" if torch.is_autocast_enabled("cuda") else "cpu"
    return torch.get_autocast_dtype(device)


def _autocast_on() -> bool:
    return torch.is_autocast_enabled("cuda") or torch.is_autocast_enabled("cpu")


def _cast(value: Any, dtype: torch.dtype) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() and value.dtype is not torch.float64 else value
    if isinstance(value, (str, bytes, np.ndarray)):
        return value
    if isinstance(value, collections.abc.Mapping):
        return {_cast(k, dtype): _cast(v, dtype) for k, v in value.items()}
    if isinstance(value, collections.abc.Iterable):
        items = (_cast(v, dtype) for v in value)
        return type(value)(items) if isinstance(value, (list, tuple)) else items
    return value


def cast_if_autocast_enabled(*args: Any) -> Any:
    """``args`` cast to the autocast dtype when autocast is on (NxD: apex's rule; CUDA or CPU autocast here)."""
    return _cast(args, _autocast_dtype()) if _autocast_on() else args


def verify_casted_dtype(value: Any) -> None:
    """Assert every floating tensor in ``value`` has the autocast dtype (when autocast is on)."""
    if not _autocast_on():
        return
    if isinstance(value, torch.Tensor):
        assert value.dtype == _autocast_dtype(), f"Datatype of tensor is expected to be {_autocast_dtype()}, got {value.dtype} instead"
    elif isinstance(value, collections.abc.Mapping):
        for k, v in value.items():
            verify_casted_dtype(k)
            verify_casted_dtype(v)
    elif isinstance(value, collections.abc.Iterable) and not isinstance(value, (str, bytes)):
        for v in value:
            verify_casted_dtype(v)


def move_all_tensor_to_cpu(data: Any, convert: bool = True) -> Any:
    """Tensors in ``data`` (dicts, lists, tuples) moved to the CPU (NxD: its XLA tensors, synced first)."""
    if not convert:
        return data
    if isinstance(data, torch.Tensor):
        return data.cpu()
    if isinstance(data, dict):
        return {k: move_all_tensor_to_cpu(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return type(data)(move_all_tensor_to_cpu(v) for v in data)
    return data


def move_model_to_device(model: torch.nn.Module, device: torch.device) -> None:
    """Deprecated in NxD for ``neuronx_distributed.utils.model_utils.move_model_to_device``."""
    from neuronx_distributed.utils import model_utils

    model_utils.move_model_to_device(model, device)


def initialize_fallback_parallel_state(device: torch.device | None = None) -> None:
    """NxD's single-process set-up: a world of one (gloo) and TP = PP = 1."""
    from nxd_core_parallel import parallel_state

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    dist.init_process_group(backend="gloo", world_size=1, rank=0)
    parallel_state.initialize_model_parallel()
