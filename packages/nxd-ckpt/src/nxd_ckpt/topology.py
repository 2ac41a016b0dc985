"""This rank's place in the (TP, DP, PP) layout, read from the parallel context the checkpointer is given.

Without model parallelism initialised every rank is a data-parallel replica (TP = PP = 1); without
torch.distributed there is one rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from nxd import ParallelContext
from nxd_ckpt.errors import CheckpointError


@dataclass(frozen=True)
class Topology:
    rank: int
    world: int
    tp: int
    pp: int
    dp: int
    tp_rank: int
    pp_rank: int
    dp_rank: int
    #: context-parallel rank: CP ranks hold the same weights and optimizer state, only CP rank 0 writes
    cp_rank: int = 0
    #: expert-parallel degree: ZeRO-1 shards of expert state are laid out per EP rank
    ep: int = 1
    #: expert-parallel rank: which of NxD's per-EP-rank model files (``_ep_rank_EE``) this rank reads
    ep_rank: int = 0

    @property
    def distributed(self) -> bool:
        return self.world > 1

    @property
    def writes_replica(self) -> bool:
        """Whether this rank writes the (DP- and CP-replicated) model and plain optimizer state."""
        return self.dp_rank == 0 and self.cp_rank == 0

    def degrees(self) -> dict[str, int]:
        return {"tp": self.tp, "pp": self.pp, "dp": self.dp, "ep": self.ep, "world": self.world}


def topology_of(context: ParallelContext | None) -> Topology:
    """This rank's place in ``context``; without one every rank is a data-parallel replica."""
    if not (dist.is_available() and dist.is_initialized()):
        return Topology(0, 1, 1, 1, 1, 0, 0, 0)
    rank, world = dist.get_rank(), dist.get_world_size()
    if context is None:
        return Topology(rank, world, 1, 1, world, 0, 0, rank)
    return Topology(rank, world, context.tp.size, context.pp.size, context.dp.size,
                    context.tp.rank, context.pp.rank, context.dp.rank, context.cp.rank, context.ep.size,
                    context.ep.rank)


class GroupGone(CheckpointError):
    """The process group a collective step was meant for no longer exists (or changed size)."""


@dataclass(frozen=True)
class Ranks:
    """The process group a save (or load) started with, and its size.

    Recorded on the training thread when the operation starts and used for every agreement after
    that, so an agreement can never quietly shrink to one rank: if the group was destroyed in the
    meantime (a training loop's ``finally`` after another rank died, say) every collective here
    raises :class:`GroupGone` instead of answering for the ranks that are not there.
    """

    group: Any
    world: int

    @classmethod
    def current(cls, group: Any = None) -> Ranks:
        """The live group (``group`` or the default one); a single process when not distributed."""
        if not (dist.is_available() and dist.is_initialized()):
            return cls(None, 1)
        group = group if group is not None else dist.group.WORLD
        return cls(group, dist.get_world_size(group))

    def check(self, what: str) -> None:
        """Raise :class:`GroupGone` unless the group this started with still exists, whole."""
        if self.group is None:
            return
        try:
            alive = dist.is_initialized() and len(dist.get_process_group_ranks(self.group)) == self.world
        except (KeyError, ValueError, RuntimeError):  # torch forgets destroyed groups: KeyError
            alive = False
        if not alive:
            raise GroupGone(f"{what}: the process group of the {self.world} ranks it started with is gone "
                            "(destroyed, or a rank failed); it needs every one of them, so it did not happen")

    def all_gather(self, obj: Any, what: str) -> list[Any]:
        """Every rank's ``obj``, by rank; raises :class:`GroupGone` rather than answer for fewer ranks."""
        if self.group is None:
            return [obj]
        self.check(what)
        if self.world == 1:  # nothing to agree with; skips the pickling round trip through the backend
            return [obj]
        out: list[Any] = [None] * self.world
        try:
            dist.all_gather_object(out, obj, group=self.group)
        except RuntimeError as exc:  # a rank died or hung: gloo/NCCL report it on the others
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise CheckpointError(f"{what}: the agreement of the {self.world} ranks failed, so it did not "
                                  f"happen (a rank failed or is gone?): {first}") from exc
        return out

    def barrier(self, what: str) -> None:
        if self.group is not None:
            self.check(what)
            dist.barrier(group=self.group)
