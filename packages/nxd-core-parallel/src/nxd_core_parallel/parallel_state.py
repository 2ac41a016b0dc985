"""NxD's ``parallel_state`` API: a thin facade over the current :class:`nxd.parallel.ParallelContext`.

Global rank = ((pp_rank * dp + dp_rank) * cp + cp_rank) * tp + tp_rank: tensor-parallel ranks are
contiguous (stride 1), context-parallel ranks have stride ``tp``, data-parallel ranks ``cp * tp``,
pipeline stages are outermost; expert regions re-read data x context as expert-data x expert-model
(see ``nxd.parallel``). The groups use the default process group's backend (gloo on CPU, NCCL on
CUDA) and the context's timeout.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch.distributed as dist

from nxd.parallel import (
    ParallelContext,
    ParallelDim,
    current_parallel_context,
    destroy_parallel_context,
    get_parallel_context,
)


def rank_coordinates(rank: int, tensor_model_parallel_size: int, data_parallel_size: int) -> tuple[int, int, int]:
    """``(tp_rank, dp_rank, pp_rank)`` of global ``rank`` in NxD's layout (no context parallelism)."""
    tp, dp = tensor_model_parallel_size, data_parallel_size
    return rank % tp, (rank // tp) % dp, rank // (tp * dp)


def initialize_model_parallel(
    tensor_model_parallel_size: int = 1,
    pipeline_model_parallel_size: int = 1,
    expert_model_parallel_size: int = 1,
    *,
    context_parallel_size: int = 1,
    timeout: timedelta | None = None,
) -> ParallelContext:
    """Create every parallel group and make the context current. Every rank must call this, with
    the same sizes; calling it again with the same sizes (and no other ``timeout``) keeps the
    existing groups. ``timeout`` bounds every collective on every group (default 30 minutes).
    Returns the context (NxD returns nothing; nxd's callers pass it on instead of reading it back)."""
    from nxd_core_parallel.context import start_parallel_context

    return start_parallel_context(tensor_model_parallel_size, pipeline_model_parallel_size,
                                  context_parallel_size, expert_model_parallel_size, timeout=timeout)


def model_parallel_is_initialized() -> bool:
    return current_parallel_context() is not None


def destroy_model_parallel() -> None:
    """Forget the groups (the default process group stays)."""
    destroy_parallel_context()


def _size(name: str) -> int:
    context = current_parallel_context()
    return context.dim(name).size if context is not None else 1


def _rank(name: str) -> int:
    context = current_parallel_context()
    return context.dim(name).rank if context is not None else 0


def _group(name: str, as_list: bool) -> Any:
    dim: ParallelDim = get_parallel_context().dim(name)
    return list(dim.ranks) if as_list else dim.group


# ---------------------------------------------------------------- tensor parallel
def get_tensor_model_parallel_group(as_list: bool = False) -> Any:
    return _group("tp", as_list)


def get_tensor_model_parallel_size() -> int:
    return _size("tp")


def get_tensor_model_parallel_rank() -> int:
    return _rank("tp")


def get_tensor_model_parallel_src_rank() -> int:
    return get_parallel_context().tp.src_rank


def get_tensor_model_parallel_ranks() -> list[int]:
    return list(get_parallel_context().tp.ranks)


# ---------------------------------------------------------------- data parallel
def get_data_parallel_group(as_list: bool = False) -> Any:
    return _group("dp", as_list)


def get_data_parallel_size() -> int:
    return _size("dp")


def get_data_parallel_rank() -> int:
    return _rank("dp")


def get_data_parallel_src_rank() -> int:
    return get_parallel_context().dp.src_rank


def get_data_parallel_ranks() -> list[int]:
    return list(get_parallel_context().dp.ranks)


# ---------------------------------------------------------------- context parallel
def get_context_model_parallel_group(as_list: bool = False) -> Any:
    return _group("cp", as_list)


def get_context_model_parallel_size() -> int:
    return _size("cp")


def get_context_model_parallel_rank() -> int:
    return _rank("cp")


# ---------------------------------------------------------------- expert parallel
def get_expert_model_parallel_group(as_list: bool = False) -> Any:
    return _group("ep", as_list)


def get_expert_model_parallel_size() -> int:
    return _size("ep")


def get_expert_model_parallel_rank() -> int:
    return _rank("ep")


def get_expert_data_parallel_group(as_list: bool = False) -> Any:
    return _group("edp", as_list)


def get_expert_data_parallel_size() -> int:
    return _size("edp")


def get_expert_data_parallel_rank() -> int:
    return _rank("edp")


# ---------------------------------------------------------------- pipeline parallel
def get_pipeline_model_parallel_group(as_list: bool = False) -> Any:
    return _group("pp", as_list)


def get_pipeline_model_parallel_size() -> int:
    return _size("pp")


def get_pipeline_model_parallel_rank() -> int:
    return _rank("pp")


def get_pipeline_model_parallel_ranks() -> list[int]:
    return list(get_parallel_context().pp.ranks)


def get_pipeline_model_parallel_next_rank() -> int:
    """Global rank of the next stage (wrapping around, as Megatron/NxD do)."""
    pp = get_parallel_context().pp
    return pp.ranks[(pp.rank + 1) % pp.size]


def get_pipeline_model_parallel_prev_rank() -> int:
    pp = get_parallel_context().pp
    return pp.ranks[(pp.rank - 1) % pp.size]


def is_pipeline_first_stage() -> bool:
    return get_pipeline_model_parallel_rank() == 0


def is_pipeline_last_stage() -> bool:
    return get_pipeline_model_parallel_rank() == get_pipeline_model_parallel_size() - 1


# ---------------------------------------------------------------- GQA KV replication
def get_kv_shared_group(kv_size_multiplier: int, as_list: bool = False) -> Any:
    """The TP ranks that hold the same (replicated) KV piece for ``kv_size_multiplier`` m:
    this rank's block of m consecutive TP ranks."""
    dim = get_parallel_context().kv_shared_dim(kv_size_multiplier)
    return list(dim.ranks) if as_list else dim.group


def is_global_rank_zero() -> bool:
    return not dist.is_initialized() or dist.get_rank() == 0
