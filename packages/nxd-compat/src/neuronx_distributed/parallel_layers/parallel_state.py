"""``neuronx_distributed.parallel_layers.parallel_state``: nxd's process groups with NxD's names.

NxD's ``get_*_replica_groups()`` list every group of a kind (XLA's replica-group form), and the
context-parallel getters describe the CP dimension; until nxd-core-parallel's parallel context
provides them they are derived here from nxd's rank layout, with context parallel size 1.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from nxd_core_parallel.parallel_state import *  # noqa: F403
from nxd_core_parallel.parallel_state import (
    get_data_parallel_rank,
    get_data_parallel_size,
    get_pipeline_model_parallel_rank,
    get_pipeline_model_parallel_size,
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_size,
    model_parallel_is_initialized,
)


def _sizes() -> tuple[int, int, int]:
    return get_tensor_model_parallel_size(), get_data_parallel_size(), get_pipeline_model_parallel_size()


def get_tensor_model_parallel_replica_groups() -> list[list[int]]:
    tp, dp, pp = _sizes()
    return [[p * dp * tp + d * tp + t for t in range(tp)] for p in range(pp) for d in range(dp)]


def get_data_parallel_replica_groups() -> list[list[int]]:
    tp, dp, pp = _sizes()
    return [[p * dp * tp + d * tp + t for d in range(dp)] for p in range(pp) for t in range(tp)]


def get_pipeline_model_parallel_replica_groups() -> list[list[int]]:
    tp, dp, pp = _sizes()
    return [[p * dp * tp + d * tp + t for p in range(pp)] for d in range(dp) for t in range(tp)]


try:  # the parallel context's CP dimension, once nxd-core-parallel has it
    from nxd_core_parallel.parallel_state import (
        get_context_model_parallel_group,
        get_context_model_parallel_rank,
        get_context_model_parallel_size,
    )
except ImportError:
    _CP_GROUPS: dict[int, Any] = {}

    def get_context_model_parallel_size() -> int:
        return 1

    def get_context_model_parallel_rank() -> int:
        return 0

    def get_context_model_parallel_group(as_list: bool = False) -> Any:
        """This rank alone (context parallel size 1)."""
        rank = dist.get_rank() if dist.is_initialized() else 0
        if as_list:
            return [rank]
        if rank not in _CP_GROUPS:
            _CP_GROUPS[rank] = dist.new_group([rank], use_local_synchronization=True)
        return _CP_GROUPS[rank]


def get_context_model_parallel_replica_groups() -> list[list[int]]:
    if get_context_model_parallel_size() == 1:
        world = dist.get_world_size() if dist.is_initialized() else 1
        return [[r] for r in range(world)]
    raise NotImplementedError("get_context_model_parallel_replica_groups at context parallel size > 1 needs "
                              "nxd-core-parallel's parallel context")


def get_context_model_parallel_src_tgt_pairs() -> list[list[int]]:
    """The ring of this rank's CP group as ``[source, target]`` pairs (NxD's ring-attention input)."""
    group = get_context_model_parallel_group(as_list=True)
    ranks = list(group[0] if group and isinstance(group[0], list) else group)
    return [[ranks[i], ranks[(i + 1) % len(ranks)]] for i in range(len(ranks))]


def get_zero1_sharding_groups() -> list[list[int]]:
    return get_data_parallel_replica_groups()


def arrange_kv_groups(num_tensor_model_parallel_groups: int = 1, tensor_model_parallel_size: int = 1,
                      kv_shared_group_size: int = 1, sequential_ranks_in_group: bool = False,
                      hardware_type: Any = None) -> list[list[int]]:
    """NxD's KV-replication groups: ranks that hold the same KV heads. nxd's GQA layout is the
    adjacent one (TP rank ``r`` holds KV piece ``r // kv_shared_group_size``), which NxD calls the
    Trn2 / sequential arrangement; the interleaved (Trn1) arrangement is refused."""
    if not sequential_ranks_in_group and str(getattr(hardware_type, "value", hardware_type)).lower() != "trn2":
        raise ValueError("arrange_kv_groups: nxd replicates KV heads on adjacent TP ranks; pass "
                         "sequential_ranks_in_group=True (the interleaved Trn1 layout is not nxd's)")
    total = num_tensor_model_parallel_groups * tensor_model_parallel_size
    return [list(range(start, start + kv_shared_group_size)) for start in range(0, total, kv_shared_group_size)]


def get_rank_info_str() -> str:
    if model_parallel_is_initialized():
        return (f"DP_{get_data_parallel_rank()}_TP_{get_tensor_model_parallel_rank()}_"
                f"PP_{get_pipeline_model_parallel_rank()}")
    return "model_parallel_uninitialized"


def rmsg(msg: str) -> str:
    """``msg`` prefixed with this rank's coordinates (NxD's log helper)."""
    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    if not model_parallel_is_initialized():
        return f"[rank_{rank}_pp-1_tp-1_dp-1_cp-1] {msg}"
    return (f"[rank_{rank}_pp{get_pipeline_model_parallel_rank()}_tp{get_tensor_model_parallel_rank()}"
            f"_dp{get_data_parallel_rank()}_cp{get_context_model_parallel_rank()}] {msg}")
