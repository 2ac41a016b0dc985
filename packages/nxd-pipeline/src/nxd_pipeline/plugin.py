"""nxd plugin entry point for nxd-pipeline: schedules, pipeline_config checks, the ``pipeline`` model transform."""

from __future__ import annotations

from typing import Any

import nxd
from nxd.run_config import RunConfig
from nxd.transforms import ModelTransform, When
from nxd_pipeline.config import parse_pipeline_config
from nxd_pipeline.schedules import BUILTIN_SCHEDULES

NXD_PLUGIN_API = (4, 4)  # plugin-API versions this plugin supports (inclusive range)


@nxd.hookimpl
def nxd_register_pipeline_schedules(registry: Any) -> None:
    for schedule in BUILTIN_SCHEDULES:
        registry.add(schedule.name, schedule, virtual=schedule.virtual, description=schedule.description)


@nxd.hookimpl
def nxd_validate_config(nxd_config: RunConfig) -> None:
    pp = nxd_config.pipeline_parallel_size
    if pp == 1 and not nxd_config.pipeline_config:
        return  # no pipeline and no options: nothing of this plugin's to judge
    cfg = parse_pipeline_config(nxd_config.pipeline_config, pp)
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


def _split(model: Any, context: nxd.ParallelContext | None, nxd_config: RunConfig) -> Any:
    from nxd_pipeline.model import NxDPPModel

    return NxDPPModel(model, nxd_config.pipeline_parallel_size, nxd_config.pipeline_config, context=context)


PIPELINE_TRANSFORM = ModelTransform("pipeline", "pipeline", _split, When("pipeline_parallel_size", above=1),
                                    description="cut the model into stages over context.pp (NxDPPModel)")


@nxd.hookimpl
def nxd_register_model_transforms(registry: Any) -> None:
    registry.add(PIPELINE_TRANSFORM.name, PIPELINE_TRANSFORM)
