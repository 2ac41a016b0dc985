"""The DeviceMesh FSDP shards over, taken from nxd's parallel context (never a new world mesh).

FSDP: a 1-D mesh over the context's data-parallel group (``dp_shard``). HSDP: a 2-D mesh
``(dp_replicate, dp_shard)`` over the same ranks: DP rank ``d`` is replica ``d // S`` and shard
``d % S`` with ``S = DP / replicate_degree``, so the ranks of one shard group are neighbours in the
DP group. Tensor and pipeline parallelism stay outside the mesh: each TP/PP rank's parameters are
its own (TP-local) tensors, sharded over its DP group only."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from nxd import ParallelContext

SHARD_DIM = "dp_shard"
REPLICATE_DIM = "dp_replicate"

# (id(context), replicate_degree) -> mesh; HSDP's sub-groups are created once per context
_MESHES: dict[tuple[int, int], tuple[ParallelContext, DeviceMesh]] = {}


def _hsdp_groups(context: ParallelContext, replicate: int) -> tuple[Any, Any, list[int]]:
    """This rank's replicate and shard groups and its DP group's ranks. Every rank creates every
    sub-group, in the same order (``new_group`` is collective over the world)."""
    mine: tuple[Any, Any] = (None, None)
    for ranks in context.dp.all_ranks:
        shards = len(ranks) // replicate
        shard_groups = [ranks[i * shards:(i + 1) * shards] for i in range(replicate)]
        replicate_groups = [ranks[j::shards] for j in range(shards)]
        created = {tuple(r): dist.new_group(list(r), timeout=context.timeout)
                   for r in [*shard_groups, *replicate_groups]}
        if context.rank in ranks:
            shard = next(g for g in shard_groups if context.rank in g)
            rep = next(g for g in replicate_groups if context.rank in g)
            mine = (created[tuple(rep)], created[tuple(shard)])
    return mine[0], mine[1], list(context.dp.ranks)


def fsdp_mesh(context: ParallelContext, replicate_degree: int = 1) -> DeviceMesh:
    """The mesh of ``context``'s data-parallel ranks for ``fully_shard`` (1-D FSDP, or 2-D HSDP when
    ``replicate_degree > 1``). Collective over the world the first time for HSDP."""
    key = (id(context), replicate_degree)
    cached = _MESHES.get(key)
    if cached is not None and cached[0] is context:
        return cached[1]
    device_type = context.device.type
    if context.dp.size % replicate_degree:
        raise ValueError(f"replicate_degree={replicate_degree} does not divide the data-parallel size {context.dp.size}")
    if replicate_degree == 1:
        mesh = DeviceMesh.from_group(context.dp.group, device_type, mesh_dim_names=(SHARD_DIM,))
    else:
        rep, shard, ranks = _hsdp_groups(context, replicate_degree)
        layout = torch.tensor(ranks, dtype=torch.int).view(replicate_degree, -1)
        mesh = DeviceMesh.from_group([rep, shard], device_type, mesh=layout, mesh_dim_names=(REPLICATE_DIM, SHARD_DIM))
    _MESHES[key] = (context, mesh)
    return mesh


def shard_group(mesh: DeviceMesh) -> Any:
    """The process group parameters are sharded over (HSDP: within one replica)."""
    return mesh.get_group(SHARD_DIM)


def shard_coordinates(mesh: DeviceMesh) -> tuple[int, int]:
    """``(shard rank, shard count)`` of this rank along the sharded mesh dimension."""
    return mesh.get_local_rank(SHARD_DIM), mesh.size(mesh.mesh_dim_names.index(SHARD_DIM))
