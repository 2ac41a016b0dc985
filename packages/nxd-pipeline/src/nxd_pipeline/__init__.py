"""Pipeline parallelism: stage partitioning and pluggable schedules (GPipe, 1F1B, interleaved, zero-bubble).

The user writes one model (see docs/pipeline.md for what a pipeline-able model provides); nxd cuts
it into stages and runs a schedule registered under ``nxd_register_pipeline_schedules``.
"""

from nxd_pipeline.config import PipelineConfig, parse_pipeline_config
from nxd_pipeline.model import NxDPPModel
from nxd_pipeline.partition import LayerSlice, plan_stages
from nxd_pipeline.schedules import (
    BUILTIN_SCHEDULES,
    Action,
    PipelineSchedule,
    Simulation,
    gpipe,
    interleaved_1f1b,
    one_f_one_b,
    simulate,
    zero_bubble_h1,
)
from nxd_pipeline.state import merge_stage_state_dicts

__version__ = "0.1.0"

__all__ = [
    "BUILTIN_SCHEDULES", "Action", "LayerSlice", "NxDPPModel", "PipelineConfig", "PipelineSchedule",
    "Simulation", "gpipe", "interleaved_1f1b", "merge_stage_state_dicts", "one_f_one_b",
    "parse_pipeline_config", "plan_stages", "simulate", "zero_bubble_h1",
]
