"""Expert-parallel process groups (NxD's layout).

In expert regions NxD reads the ranks as ``[PP, EDP, EP, TP]`` instead of ``[PP, DP, TP]``
(``EDP * EP == DP``): a rank keeps its TP and PP coordinates, and its data-parallel index ``d``
splits into the expert-parallel rank ``d % EP`` and the expert-data-parallel rank ``d // EP``.
The EP group all-to-alls tokens; the expert-data-parallel group (ranks holding the same experts)
reduces expert gradients.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from nxd.errors import ConfigError
from nxd_core_parallel import parallel_state


@dataclass
class ExpertParallelGroups:
    ep_size: int
    ep_rank: int
    ep_group: Any
    ep_ranks: list[int]
    edp_size: int
    edp_rank: int
    edp_group: Any
    edp_ranks: list[int]
    dp_size: int
    tp_size: int = 1
    pp_size: int = 1


_GROUPS: ExpertParallelGroups | None = None


def initialize_expert_parallel(expert_model_parallel_size: int = 1) -> ExpertParallelGroups:
    """Create the EP and expert-data-parallel groups over the current parallel state (collective:
    every rank calls it with the same size, after ``initialize_model_parallel``)."""
    global _GROUPS
    ep = int(expert_model_parallel_size)
    dp = parallel_state.get_data_parallel_size()
    if ep < 1 or dp % ep:
        raise ConfigError(f"expert_model_parallel_size ({ep}) must be >= 1 and divide the data-parallel size ({dp})")
    tp, pp = parallel_state.get_tensor_model_parallel_size(), parallel_state.get_pipeline_model_parallel_size()
    if _GROUPS is not None and (_GROUPS.ep_size, _GROUPS.dp_size, _GROUPS.tp_size, _GROUPS.pp_size) == (ep, dp, tp, pp):
        return _GROUPS
    rank = dist.get_rank() if dist.is_initialized() else 0
    if ep == 1:
        dp_group = parallel_state.get_data_parallel_group() if parallel_state.model_parallel_is_initialized() else None
        dp_ranks = parallel_state.get_data_parallel_ranks() if parallel_state.model_parallel_is_initialized() else [rank]
        _GROUPS = ExpertParallelGroups(1, 0, None, [rank], dp, parallel_state.get_data_parallel_rank(), dp_group,
                                       dp_ranks, dp, tp, pp)
        return _GROUPS
    edp = dp // ep
    mine: dict[str, tuple[Any, list[int]]] = {}
    for p in range(pp):
        for t in range(tp):
            dp_ranks = [p * dp * tp + d * tp + t for d in range(dp)]
            for name, blocks in (("ep", [dp_ranks[j * ep:(j + 1) * ep] for j in range(edp)]),
                                 ("edp", [dp_ranks[e::ep] for e in range(ep)])):
                for ranks in blocks:
                    group = dist.new_group(ranks)  # collective: every rank creates every group in order
                    if rank in ranks:
                        mine[name] = (group, ranks)
    d = parallel_state.get_data_parallel_rank()
    _GROUPS = ExpertParallelGroups(ep, d % ep, mine["ep"][0], mine["ep"][1], edp, d // ep, mine["edp"][0],
                                   mine["edp"][1], dp, tp, pp)
    return _GROUPS


def expert_parallel_groups() -> ExpertParallelGroups:
    """The current groups (EP=1 when :func:`initialize_expert_parallel` has not run)."""
    current = (parallel_state.get_data_parallel_size(), parallel_state.get_tensor_model_parallel_size(),
               parallel_state.get_pipeline_model_parallel_size())
    if _GROUPS is None or (_GROUPS.dp_size, _GROUPS.tp_size, _GROUPS.pp_size) != current:
        return initialize_expert_parallel(1)
    return _GROUPS


def destroy_expert_parallel() -> None:
    global _GROUPS
    _GROUPS = None


def get_expert_model_parallel_size() -> int:
    return expert_parallel_groups().ep_size


def get_expert_model_parallel_rank() -> int:
    return expert_parallel_groups().ep_rank


def get_expert_model_parallel_group() -> Any:
    return expert_parallel_groups().ep_group


def get_expert_data_parallel_group() -> Any:
    return expert_parallel_groups().edp_group


def get_expert_data_parallel_size() -> int:
    return expert_parallel_groups().edp_size
