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
from nxd_plan.planner import Plan, building_overrides, load
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


def dry_run(plan: Plan, source: Any, overrides: Sequence[str] = (), *, ranks: Sequence[int] | None = None,
            progress: Callable[[int, int], None] | None = None) -> DryRun:
    lay = plan.layout
    config, run = load(source, building_overrides(lay, overrides))
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
        if shard.numel != planned.params:
            problems.append(f"{shard.numel} parameters != planned {planned.params}")
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
