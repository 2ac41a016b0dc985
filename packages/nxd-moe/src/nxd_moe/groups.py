"""This rank's expert-parallel groups, read from a parallel context (:class:`nxd.parallel.ParallelContext`).

NxD's layout (built by the core's ``rank_layout``): expert regions read the ranks as
``[PP, EDP, EP, TP]`` instead of ``[PP, DP, TP]`` (``EDP * EP == DP``), so a rank keeps its TP and
PP coordinates; its data-parallel index ``d`` becomes EP rank ``d % EP`` and expert-data-parallel
rank ``d // EP``. The EP group all-to-alls tokens; the expert-data-parallel group (ranks holding
the same experts) reduces expert gradients. Set the size with
``neuronx_distributed_config(expert_parallel_size=...)`` or
``parallel_state.initialize_model_parallel(..., expert_model_parallel_size=...)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import nxd


@dataclass(frozen=True)
class ExpertParallelGroups:
    ep_size: int
    ep_rank: int
    ep_group: Any
    edp_size: int
    edp_rank: int
    edp_group: Any
    dp_size: int


def expert_parallel_groups(context: nxd.ParallelContext | None) -> ExpertParallelGroups:
    """``context``'s EP and expert-data-parallel groups (EP=1 without a context)."""
    if context is None:
        return ExpertParallelGroups(1, 0, None, 1, 0, None, 1)
    return ExpertParallelGroups(context.ep.size, context.ep.rank, context.ep.group, context.edp.size,
                                context.edp.rank, context.edp.group, context.dp.size)
