"""``neuronx_distributed.parallel_layers.parallel_state``: nxd's process groups with NxD's names.

Everything is nxd-core-parallel's facade over the parallel context; added here are NxD's
``get_*_replica_groups()`` (every group of a dimension, XLA's replica-group form), the ring pairs
of the context-parallel group, ``arrange_kv_groups``, ``initialize_kv_group``, ``get_world_group`` and
NxD's log helpers.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

import nxd
from nxd_compat.surface import not_provided
from nxd_core_parallel.parallel_state import *  # noqa: F403
from nxd_core_parallel.parallel_state import (
    get_context_model_parallel_rank,
    get_data_parallel_rank,
    get_kv_shared_group,
    get_pipeline_model_parallel_rank,
    get_tensor_model_parallel_rank,
    model_parallel_is_initialized,
)


def _replica_groups(dimension: str) -> list[list[int]]:
    return [list(ranks) for ranks in nxd.get_parallel_context().dim(dimension).all_ranks]


def get_tensor_model_parallel_replica_groups() -> list[list[int]]:
    return _replica_groups("tp")


def get_data_parallel_replica_groups() -> list[list[int]]:
    return _replica_groups("dp")


def get_pipeline_model_parallel_replica_groups() -> list[list[int]]:
    return _replica_groups("pp")


def get_context_model_parallel_replica_groups() -> list[list[int]]:
    return _replica_groups("cp")


def get_expert_model_parallel_replica_groups() -> list[list[int]]:
    return _replica_groups("ep")


def get_expert_data_parallel_replica_groups() -> list[list[int]]:
    return _replica_groups("edp")


def get_zero1_sharding_groups() -> list[list[int]]:
    """NxD's ZeRO-1 sharding groups: data parallel, joined with context parallel when CP > 1."""
    return _replica_groups("dp_cp")


def get_context_model_parallel_src_tgt_pairs() -> list[list[int]]:
    """The ring of this rank's CP group as ``[source, target]`` pairs (NxD's ring-attention input)."""
    ranks = list(nxd.get_parallel_context().cp.ranks)
    return [[ranks[i], ranks[(i + 1) % len(ranks)]] for i in range(len(ranks))]


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


def initialize_kv_group(kv_shared_group_size: int = 1, sequential_ranks_in_group: bool = False) -> None:
    """NxD's: build the groups of TP ranks that hold the same replicated KV heads. They are nxd's GQA
    layers' own groups (nxd-core-parallel's ``get_kv_shared_group``, which they also create when
    first needed): adjacent TP ranks, NxD's layout with ``sequential_ranks_in_group=True`` or on Trn2;
    NxD's default on Trn1 interleaves them, which nxd does not (``arrange_kv_groups``)."""
    get_kv_shared_group(kv_shared_group_size)


def get_world_group(as_list: bool = False) -> Any:
    """NxD's: the group of every rank (``as_list``: its ranks, as one replica group)."""
    return [list(range(dist.get_world_size()))] if as_list else dist.group.WORLD


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


def _token_shuffling():  # NxD keeps the token shuffle groups here; nxd-compat's MoE module owns them
    from neuronx_distributed.modules.moe import token_shuffling

    return token_shuffling


def initialize_token_shuffle_group(token_shuffle_group_size: int = 1) -> None:
    _token_shuffling().initialize_token_shuffle_group(token_shuffle_group_size)


def get_token_shuffle_group(as_list: bool = False) -> Any:
    return _token_shuffling().get_token_shuffle_group(as_list)


def get_token_shuffle_replica_groups() -> list[list[int]]:
    return _token_shuffling().get_token_shuffle_replica_groups()


def get_token_shuffle_group_size() -> int:
    return _token_shuffling().get_token_shuffle_group_size()


def destroy_token_shuffle_group() -> None:
    _token_shuffling().destroy_token_shuffle_group()


_RINGS = ("NxD's Trainium device-ring group layouts (rank orders for Neuron's ring topology); nxd's groups are "
          "torch DeviceMesh's, made by initialize_model_parallel")
__getattr__ = not_provided(__name__, dict.fromkeys(
    ("PG_Group_Logic", "ParallelGroups", "ascending_ring_PG_group", "ascending_descending_ring_PG_group",
     "get_logic_chosen"), _RINGS))
