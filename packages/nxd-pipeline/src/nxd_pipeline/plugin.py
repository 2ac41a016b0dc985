"""nxd plugin entry point for nxd-pipeline: schedules, pipeline_config checks, the pipeline wrap."""

from __future__ import annotations

from typing import Any

import nxd
from nxd.trainer import WrapPhase
from nxd_pipeline.config import parse_pipeline_config
from nxd_pipeline.schedules import BUILTIN_SCHEDULES

NXD_PLUGIN_API = (1, 1)  # plugin-API versions this plugin supports (inclusive range)


@nxd.hookimpl
def nxd_register_pipeline_schedules(registry: Any) -> None:
    for schedule in BUILTIN_SCHEDULES:
        registry.add(schedule.name, schedule, virtual=schedule.virtual, description=schedule.description)


@nxd.hookimpl
def nxd_validate_config(nxd_config: dict) -> None:
    pp = nxd_config.get("pipeline_parallel_size", 1)
    cfg = parse_pipeline_config(nxd_config.get("pipeline_config"), pp)
    if pp > 1:
        schedule = nxd.get_component("pipeline_schedule", cfg.schedule, need=f"pipeline_config.schedule={cfg.schedule!r}")
        if cfg.virtual_pipeline_size > 1 and not getattr(schedule, "virtual", False):
            raise nxd.ConfigError(
                f"pipeline_config.virtual_pipeline_size={cfg.virtual_pipeline_size} needs a schedule with virtual "
                f"stages such as 'interleaved_1f1b', got schedule {cfg.schedule!r}"
            )
        if cfg.schedule == "interleaved_1f1b" and cfg.num_microbatches % pp:
            raise nxd.ConfigError(
                f"pipeline_config.num_microbatches={cfg.num_microbatches} must be divisible by "
                f"pipeline_parallel_size={pp} for the interleaved_1f1b schedule"
            )


@nxd.hookimpl
def nxd_wrap_model(nxd_config: dict, model: Any, phase: str, context: nxd.ParallelContext | None) -> Any:
    if phase is not WrapPhase.PIPELINE or nxd_config.get("pipeline_parallel_size", 1) <= 1:
        return None
    from nxd_pipeline.model import NxDPPModel

    return NxDPPModel(model, nxd_config["pipeline_parallel_size"], nxd_config.get("pipeline_config"), context=context)
