"""Nearest layouts that fit: the same world size and global batch, one or two knobs changed
(pipeline and tensor degrees, ZeRO-1, full recomputation), each planned exactly as the config was."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from nxd import ConfigError
from nxd_plan.planner import GIB, Plan, make_run_plan


def _candidates(plan: Plan) -> list[tuple[float, dict[str, Any]]]:
    lay = plan.layout
    out = []
    for tp in {lay.tp, lay.tp * 2, max(1, lay.tp // 2)}:
        for pp in {lay.pp, lay.pp * 2, lay.pp * 4, max(1, lay.pp // 2)}:
            if plan.num_layers and pp > plan.num_layers:
                continue
            if lay.world_size % (tp * pp * lay.cp):
                continue
            for zero1 in {lay.zero1, True}:
                for full in {lay.recompute == "full", True}:
                    change = {}
                    if tp != lay.tp:
                        change["distributed_strategy.tensor_model_parallel_size"] = tp
                    if pp != lay.pp:
                        change["distributed_strategy.pipeline_model_parallel_size"] = pp
                    if zero1 != lay.zero1:
                        change["distributed_strategy.zero1"] = True
                    if full and lay.recompute != "full":
                        change["model.activations_checkpoint_granularity"] = "full"
                    if not change:
                        continue
                    distance = abs(math.log2(tp / lay.tp)) + abs(math.log2(pp / lay.pp)) + \
                        (zero1 != lay.zero1) + 1.5 * (full and lay.recompute != "full")
                    out.append((distance, change))
    return sorted(out, key=lambda item: (item[0], sorted(item[1].items())))


def propose(plan: Plan, source: Any, overrides: Sequence[str], memory_gib: float, *, limit: int = 3,
            tries: int = 8, **device: Any) -> list[tuple[dict[str, Any], Plan]]:
    """Up to ``limit`` layouts whose every rank fits ``memory_gib``, nearest first."""
    found = []
    for _, change in _candidates(plan)[:tries]:
        extra = [f"{k}={v}" for k, v in change.items()]
        if "model.activations_checkpoint_granularity" in change:
            extra.append("model.activations_checkpoint_recompute=null")
        try:
            candidate = make_run_plan(source, [*overrides, *extra], memory_gib=memory_gib, **device)
        except (ConfigError, ValueError):
            continue
        if candidate.max_peak <= memory_gib * GIB:
            found.append((change, candidate))
            if len(found) == limit:
                break
    return found
