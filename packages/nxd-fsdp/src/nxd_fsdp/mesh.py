"""The DeviceMeshes FSDP shards over, taken from nxd's parallel context (never a new world mesh).

Dense parameters: the data-parallel ranks shard (``dp_shard``); context-parallel ranks hold the
same parameters (different tokens) and are replicas, as under ZeRO-1, so checkpoints keep nxd's
per-DP-rank layout. Without CP or HSDP this is a 1-D mesh over the context's DP group. With
``replicate_degree`` R > 1 (HSDP) and/or CP > 1 it is a 2-D mesh ``(dp_replicate, dp_shard)``
over the data x context ranks: DP rank ``d`` at CP rank ``c`` is shard ``d % S``
(``S = DP / R``) of replica ``(d // S) * CP + c``, so the ranks of one shard group are neighbours
in the DP group; FSDP reduce-scatters over the shard group and all-reduces over the replicas,
averaging over all ``DP x CP`` ranks, which is the exact gradient under CP's token-mean loss.

Expert-parallel parameters (nxd-moe's experts) shard over the expert-data-parallel group (the
ranks holding the same experts): a 1-D mesh over ``context.edp``.

Tensor and pipeline parallelism stay outside the meshes: each TP/PP rank's parameters are its own
(TP-local) tensors."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from nxd import ParallelContext

SHARD_DIM = "dp_shard"
REPLICATE_DIM = "dp_replicate"

# (id(context), kind) -> mesh; sub-groups are created once per context
_MESHES: dict[tuple[int, Any], tuple[ParallelContext, DeviceMesh]] = {}


def replica_layout(dp_cp_ranks: list[int], cp: int, replicate_degree: int) -> list[list[int]]:
    """Rows: replicas, columns: shard ranks, of one data x context group (``dp_cp`` order: DP-major,
    CP-minor). Pure, so every rank computes every group's layout alike."""
    dp = len(dp_cp_ranks) // cp
    shards = dp // replicate_degree
    return [[dp_cp_ranks[(r * shards + s) * cp + c] for s in range(shards)]
            for r in range(replicate_degree) for c in range(cp)]


def _replicated_groups(context: ParallelContext, replicate: int) -> tuple[Any, Any, list[list[int]]]:
    """This rank's replicate and shard groups and its mesh layout. Every rank creates every
    sub-group, in the same order (``new_group`` is collective over the world)."""
    mine: tuple[Any, Any, list[list[int]]] = (None, None, [])
    for ranks in context.dp_cp.all_ranks:
        layout = replica_layout(list(ranks), context.cp.size, replicate)
        shard_groups = layout
        replicate_groups = [list(col) for col in zip(*layout)]
        created = {tuple(r): dist.new_group(list(r), timeout=context.timeout)
                   for r in [*shard_groups, *replicate_groups]}
        if context.rank in ranks:
            shard = next(g for g in shard_groups if context.rank in g)
            rep = next(g for g in replicate_groups if context.rank in g)
            mine = (created[tuple(rep)], created[tuple(shard)], layout)
    return mine


def _cached(context: ParallelContext, kind: Any, make: Any) -> DeviceMesh:
    key = (id(context), kind)
    cached = _MESHES.get(key)
    if cached is not None and cached[0] is context:
        return cached[1]
    mesh = make()
    _MESHES[key] = (context, mesh)
    return mesh


def fsdp_mesh(context: ParallelContext, replicate_degree: int = 1) -> DeviceMesh:
    """The mesh of ``context``'s data-parallel ranks for the dense parameters (1-D FSDP, or 2-D
    when ``replicate_degree > 1`` or context parallelism adds replicas). Collective over the world
    the first time in the 2-D case."""
    if context.dp.size % replicate_degree:
        raise ValueError(f"replicate_degree={replicate_degree} does not divide the data-parallel size {context.dp.size}")

    def make() -> DeviceMesh:
        device_type = context.device.type
        if replicate_degree == 1 and context.cp.size == 1:
            return DeviceMesh.from_group(context.dp.group, device_type, mesh_dim_names=(SHARD_DIM,))
        rep, shard, layout = _replicated_groups(context, replicate_degree)
        # the rank layout is bookkeeping on the host, also when the model is built under a meta device
        # context (nxd train --validate builds every rank that way: HSDP was refused there)
        return DeviceMesh.from_group([rep, shard], device_type, mesh=torch.tensor(layout, dtype=torch.int, device="cpu"),
                                     mesh_dim_names=(REPLICATE_DIM, SHARD_DIM))

    return _cached(context, replicate_degree, make)


def expert_mesh(context: ParallelContext) -> DeviceMesh:
    """The 1-D mesh over ``context``'s expert-data-parallel group (the ranks holding the same experts)."""
    return _cached(context, "experts", lambda: DeviceMesh.from_group(context.edp.group, context.device.type,
                                                                      mesh_dim_names=(SHARD_DIM,)))


def shard_group(mesh: DeviceMesh) -> Any:
    """The process group parameters are sharded over (HSDP: within one replica)."""
    return mesh.get_group(SHARD_DIM)


def shard_coordinates(mesh: DeviceMesh) -> tuple[int, int]:
    """``(shard rank, shard count)`` of this rank along the sharded mesh dimension."""
    return mesh.get_local_rank(SHARD_DIM), mesh.size(mesh.mesh_dim_names.index(SHARD_DIM))
