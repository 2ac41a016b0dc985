"""Which processes form this rank's pipeline, from the parallel context it is given, else (no
context: model parallelism not initialised) the default group (every rank one stage: tests and
scripts without TP/DP)."""

from __future__ import annotations

import torch.distributed as dist

from nxd.errors import ConfigError
from nxd.parallel import ParallelContext, process_group_timeout
from nxd_pipeline.comm import PipelineGroup


def pipeline_group(pp_size: int, context: ParallelContext | None) -> PipelineGroup:
    """This rank's pipeline group in ``context``; checks it has ``pp_size`` ranks."""
    if not dist.is_initialized():
        raise ConfigError(f"pipeline_parallel_size={pp_size} needs torch.distributed to be initialised (torchrun)")
    if context is not None:
        group, ranks, rank = context.pp.group, context.pp.ranks, context.pp.rank
    else:
        group, ranks, rank = None, tuple(range(dist.get_world_size())), dist.get_rank()
    if len(ranks) != pp_size:
        raise ConfigError(
            f"pipeline_parallel_size={pp_size} but this rank's pipeline group has {len(ranks)} ranks; "
            "initialise model parallelism with the same pipeline size (nxd.neuronx_distributed_config)"
        )
    return PipelineGroup(group, ranks, rank)


def all_pipeline_rank_lists(pg: PipelineGroup, context: ParallelContext | None) -> list[tuple[int, ...]]:
    """The global ranks of every pipeline group of the job (NxD layout: pipeline outermost)."""
    if context is not None:
        groups = list(context.pp.all_ranks)
    else:
        stride = dist.get_world_size() // pg.size
        groups = [tuple(i + k * stride for k in range(pg.size)) for i in range(stride)]
    if pg.ranks not in groups:
        raise RuntimeError(f"pipeline group {pg.ranks} does not follow the pipeline-outermost rank layout")
    return groups


def subgroup(pg: PipelineGroup, pp_ranks: tuple[int, ...], context: ParallelContext | None) -> dist.ProcessGroup | None:
    """A process group joining pipeline ranks ``pp_ranks`` of this rank's pipeline (created
    collectively for every pipeline of the job; ``None`` where this rank is not a member)."""
    mine = None
    for ranks in all_pipeline_rank_lists(pg, context):
        members = [ranks[i] for i in pp_ranks]
        group = dist.new_group(members, timeout=process_group_timeout())
        if dist.get_rank() in members:
            mine = group
    return mine


def data_parallel_group(context: ParallelContext | None) -> dist.ProcessGroup | None:
    return None if context is None else context.dp.group
