"""``nxd plan --dry-run``: every rank of the world built with the real parallel code on the meta
device in a fake world, one after another in this process, and checked against the plan: its
coordinates and process groups, its parameter names, shapes and dtypes (equal to those of the rank
the plan measured for its pipeline/expert coordinate), and its parameter count."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from nxd_plan.layout import _rank_layout
from nxd_plan.planner import Plan, fsdp_index, load
from nxd_plan.shards import build_shard


@dataclass
class DryRun:
    world_size: int
    ranks_built: int = 0
    seconds: float = 0.0
    #: rank -> what disagrees with the plan
    problems: dict[int, list[str]] = field(default_factory=dict)
    #: the unsharded parameter count summed from every rank's shard
    parameters_total: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems and self.ranks_built == self.world_size


def _expected_groups(plan: Plan, rank: int) -> dict[str, tuple[int, ...]]:
    lay = plan.layout
    layout = _rank_layout(lay.world_size, lay.tp, lay.pp, lay.cp, lay.ep)
    return {dim: tuple(next(g for g in groups if rank in g)) for dim, groups in layout.items()
            if dim in ("tp", "dp", "pp", "cp", "ep", "edp", "dp_cp")}


def _fsdp_problems(shard: Any, reference: Any, coords: dict[str, int]) -> list[str]:
    """FSDP: the rank sits where the plan puts it on the shard mesh, and every parameter's local
    shard (fully_shard's DTensor) has the rows FSDP's chunking rule gives (what the plan used)."""
    if (shard.fsdp is None) != (reference.fsdp is None):
        return [f"FSDP mesh {shard.fsdp} where rank {reference.rank} has {reference.fsdp}"]
    if shard.fsdp is None:
        return []
    if shard.fsdp[0] != fsdp_index(reference, coords):
        return [f"FSDP shard index {shard.fsdp[0]} != planned {fsdp_index(reference, coords)}"]
    expected = shard.stored()
    wrong = [n for n, local in shard.local.items() if local != expected[n]]
    return [f"FSDP local shard of {n}: {shard.local[n]} != planned {expected[n]}" for n in wrong[:4]]


def dry_run(plan: Plan, source: Any, overrides: Sequence[str] = (), *, ranks: Sequence[int] | None = None,
            progress: Callable[[int, int], None] | None = None) -> DryRun:
    lay = plan.layout
    config, run = load(source, overrides)
    result = DryRun(lay.world_size)
    start = time.monotonic()
    counted: set[tuple[int, int]] = set()
    for rank in (range(lay.world_size) if ranks is None else ranks):
        shard = build_shard(config, run, rank)
        planned = plan.ranks[rank]
        problems = []
        coords = {k: v for k, v in shard.coords.items() if k in planned.coords}
        if coords != planned.coords:
            problems.append(f"coordinates {coords} != planned {planned.coords}")
        expected = _expected_groups(plan, rank)
        for dim, ranks_ in expected.items():
            if shard.groups.get(dim) != ranks_:
                problems.append(f"{dim} group {shard.groups.get(dim)} != planned {ranks_}")
        reference = plan.shards[(planned.coords["pp"], planned.coords["ep"])]
        if shard.signature() != reference.signature():
            mine, theirs = dict(shard.params), dict(reference.params)
            diff = sorted(set(mine) ^ set(theirs)) or [n for n in mine if mine[n] != theirs.get(n)]
            problems.append(f"parameters differ from rank {reference.rank}'s (same pp/ep coordinates): "
                            + ", ".join(f"{n}: {mine.get(n)} vs {theirs.get(n)}" for n in diff[:4]))
        if shard.local_numel != planned.params:
            problems.append(f"{shard.local_numel} parameters stored != planned {planned.params}")
        problems += _fsdp_problems(shard, reference, planned.coords)
        if shard.stages != planned.stages:
            problems.append(f"pipeline stages {shard.stages} != planned {planned.stages}")
        if problems:
            result.problems[rank] = problems
        c = shard.coords
        if c["tp"] == 0 and c["dp"] == 0 and c["cp"] == 0 and (c["pp"], c["ep"]) not in counted:
            counted.add((c["pp"], c["ep"]))
            result.parameters_total += shard.unsharded_numel(c["ep"] == 0)
        result.ranks_built += 1
        if progress is not None:
            progress(result.ranks_built, lay.world_size)
    result.seconds = time.monotonic() - start
    return result
