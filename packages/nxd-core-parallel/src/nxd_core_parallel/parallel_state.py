"""Process groups for tensor, data and pipeline parallelism, with NxD's rank layout.

Global rank = pp_rank * (dp * tp) + dp_rank * tp + tp_rank: tensor-parallel ranks are
contiguous (stride 1), data-parallel ranks have stride ``tp``, pipeline stages are outermost.
The groups use the default process group's backend (gloo on CPU, NCCL on CUDA).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist


@dataclass
class _State:
    tp: int
    pp: int
    dp: int
    rank: int
    tp_group: Any
    dp_group: Any
    pp_group: Any
    tp_ranks: list[int]
    dp_ranks: list[int]
    pp_ranks: list[int]
    # kv_size_multiplier -> (group of TP ranks holding the same KV shard, its global ranks)
    kv_groups: dict[int, tuple[Any, list[int]]] = field(default_factory=dict)


_STATE: _State | None = None


def rank_coordinates(rank: int, tensor_model_parallel_size: int, data_parallel_size: int) -> tuple[int, int, int]:
    """``(tp_rank, dp_rank, pp_rank)`` of global ``rank`` in NxD's layout."""
    tp, dp = tensor_model_parallel_size, data_parallel_size
    return rank % tp, (rank // tp) % dp, rank // (tp * dp)


def initialize_model_parallel(tensor_model_parallel_size: int = 1, pipeline_model_parallel_size: int = 1) -> None:
    """Create the TP/DP/PP groups. Every rank must call this, with the same sizes."""
    global _STATE
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("initialize_model_parallel needs torch.distributed.init_process_group() to have run first")
    tp, pp = int(tensor_model_parallel_size), int(pipeline_model_parallel_size)
    if tp < 1 or pp < 1:
        raise ValueError(f"tensor_model_parallel_size ({tp}) and pipeline_model_parallel_size ({pp}) must be >= 1")
    world = dist.get_world_size()
    if world % (tp * pp) != 0:
        raise ValueError(
            f"world size {world} is not divisible by tensor_model_parallel_size ({tp}) x "
            f"pipeline_model_parallel_size ({pp}) = {tp * pp}; choose sizes whose product divides {world}"
        )
    if _STATE is not None:
        if (_STATE.tp, _STATE.pp) == (tp, pp):
            return
        destroy_model_parallel()
    dp = world // (tp * pp)
    rank = dist.get_rank()

    def make(all_ranks: list[list[int]], mine: int) -> tuple[Any, list[int]]:
        # new_group is collective over the world: every rank creates every group, in order.
        found: tuple[Any, list[int]] | None = None
        for ranks in all_ranks:
            group = dist.new_group(ranks)
            if mine in ranks:
                found = (group, ranks)
        assert found is not None
        return found

    tp_group, tp_ranks = make(_tp_groups(tp, dp, pp), rank)
    dp_group, dp_ranks = make([[p * dp * tp + d * tp + t for d in range(dp)] for p in range(pp) for t in range(tp)], rank)
    pp_group, pp_ranks = make([[p * dp * tp + d * tp + t for p in range(pp)] for d in range(dp) for t in range(tp)], rank)
    state = _State(tp, pp, dp, rank, tp_group, dp_group, pp_group, tp_ranks, dp_ranks, pp_ranks)
    # GQA KV replication: with multiplier m, the m consecutive TP ranks j*m .. j*m + m - 1 hold
    # the same KV piece j (GQAQKVColumnParallelLinear's layout).
    for m in range(2, tp + 1):
        if tp % m:
            continue
        if m == tp:
            state.kv_groups[m] = (tp_group, tp_ranks)
            continue
        groups = [[base + j * m + i for i in range(m)] for base in (g[0] for g in _tp_groups(tp, dp, pp))
                  for j in range(tp // m)]
        state.kv_groups[m] = make(groups, rank)
    _STATE = state


def _tp_groups(tp: int, dp: int, pp: int) -> list[list[int]]:
    return [[p * dp * tp + d * tp + t for t in range(tp)] for p in range(pp) for d in range(dp)]


def model_parallel_is_initialized() -> bool:
    return _STATE is not None


def destroy_model_parallel() -> None:
    """Forget the groups (the default process group stays)."""
    global _STATE
    state, _STATE = _STATE, None
    if state is None:
        return
    seen: set[int] = set()
    groups = [state.tp_group, state.dp_group, state.pp_group, *(g for g, _ in state.kv_groups.values())]
    for group in groups:
        if id(group) in seen or group is None:
            continue
        seen.add(id(group))
        try:
            dist.destroy_process_group(group)
        except (RuntimeError, ValueError):  # already gone with the default group
            pass


def _state() -> _State:
    if _STATE is None:
        raise RuntimeError(
            "model parallel is not initialized: call nxd.neuronx_distributed_config(...) after "
            "torch.distributed.init_process_group(), or parallel_state.initialize_model_parallel()"
        )
    return _STATE


# ---------------------------------------------------------------- tensor parallel
def get_tensor_model_parallel_group(as_list: bool = False) -> Any:
    return list(_state().tp_ranks) if as_list else _state().tp_group


def get_tensor_model_parallel_size() -> int:
    return _STATE.tp if _STATE is not None else 1


def get_tensor_model_parallel_rank() -> int:
    return _STATE.rank % _STATE.tp if _STATE is not None else 0


def get_tensor_model_parallel_src_rank() -> int:
    return _state().tp_ranks[0]


def get_tensor_model_parallel_ranks() -> list[int]:
    return list(_state().tp_ranks)


# ---------------------------------------------------------------- data parallel
def get_data_parallel_group(as_list: bool = False) -> Any:
    return list(_state().dp_ranks) if as_list else _state().dp_group


def get_data_parallel_size() -> int:
    return _STATE.dp if _STATE is not None else 1


def get_data_parallel_rank() -> int:
    return (_STATE.rank // _STATE.tp) % _STATE.dp if _STATE is not None else 0


def get_data_parallel_src_rank() -> int:
    return _state().dp_ranks[0]


def get_data_parallel_ranks() -> list[int]:
    return list(_state().dp_ranks)


# ---------------------------------------------------------------- pipeline parallel
def get_pipeline_model_parallel_group(as_list: bool = False) -> Any:
    return list(_state().pp_ranks) if as_list else _state().pp_group


def get_pipeline_model_parallel_size() -> int:
    return _STATE.pp if _STATE is not None else 1


def get_pipeline_model_parallel_rank() -> int:
    return _STATE.rank // (_STATE.tp * _STATE.dp) if _STATE is not None else 0


def get_pipeline_model_parallel_ranks() -> list[int]:
    return list(_state().pp_ranks)


def get_pipeline_model_parallel_next_rank() -> int:
    """Global rank of the next stage (wrapping around, as Megatron/NxD do)."""
    ranks = _state().pp_ranks
    return ranks[(get_pipeline_model_parallel_rank() + 1) % len(ranks)]


def get_pipeline_model_parallel_prev_rank() -> int:
    ranks = _state().pp_ranks
    return ranks[(get_pipeline_model_parallel_rank() - 1) % len(ranks)]


def is_pipeline_first_stage() -> bool:
    return get_pipeline_model_parallel_rank() == 0


def is_pipeline_last_stage() -> bool:
    return get_pipeline_model_parallel_rank() == get_pipeline_model_parallel_size() - 1


# ---------------------------------------------------------------- GQA KV replication
def get_kv_shared_group(kv_size_multiplier: int, as_list: bool = False) -> Any:
    """The TP ranks that hold the same (replicated) KV piece for ``kv_size_multiplier`` m:
    this rank's block of m consecutive TP ranks."""
    state = _state()
    if kv_size_multiplier not in state.kv_groups:
        raise ValueError(
            f"kv_size_multiplier={kv_size_multiplier} must divide tensor_model_parallel_size={state.tp} and be > 1"
        )
    group, ranks = state.kv_groups[kv_size_multiplier]
    return list(ranks) if as_list else group


def is_global_rank_zero() -> bool:
    return not dist.is_initialized() or dist.get_rank() == 0
