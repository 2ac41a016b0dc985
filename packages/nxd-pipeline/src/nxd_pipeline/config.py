"""``pipeline_config``: the keys nxd-pipeline understands, checked before anything runs."""

from __future__ import annotations

import difflib
import numbers
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn

from nxd.errors import ConfigError
from nxd.resolved import DEFAULT_PIPELINE_SCHEDULE as DEFAULT_SCHEDULE
from nxd.resolved import pipeline_schedule

#: NxD NxDPPModel arguments about FX tracing or XLA that have no meaning without tracing: accepted
#: so NxD configs keep working, and ignored with a warning.
IGNORED_NXD_KEYS = (
    "input_names", "leaf_module_cls", "autowrap_functions", "autowrap_modules", "autowrap_obj_methods",
    "tracer_cls", "trace_file_path", "param_init_fn", "use_zero1_optimizer", "use_model_wrapper",
    "use_optimizer_wrapper", "deallocate_pipeline_outputs", "fuse_microbatches", "return_loss_on_cpu",
)
VALID_KEYS = (
    "num_microbatches", "schedule", "virtual_pipeline_size", "pipeline_cuts", "auto_partition",
    "partition_method", "transformer_layer_cls", "output_loss_value_spec", "loss_fn",
    "broadcast_and_average_loss",
) + IGNORED_NXD_KEYS


@dataclass(frozen=True)
class PipelineConfig:
    num_microbatches: int = 1
    schedule: str = DEFAULT_SCHEDULE
    virtual_pipeline_size: int = 1
    pipeline_cuts: tuple[Any, ...] | None = None
    partition_method: str = "even"
    transformer_layer_cls: tuple[type, ...] = ()
    output_loss_value_spec: tuple[bool, ...] | None = None
    loss_fn: Callable[..., Any] | None = None
    broadcast_and_average_loss: bool = False


def _int(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ConfigError(f"pipeline_config.{key} must be a positive integer, got {value!r}")
    return int(value)


def parse_pipeline_config(raw: dict | None, pipeline_parallel_size: int = 1) -> PipelineConfig:
    """Check ``raw`` (``nxd_config["pipeline_config"]``) and return it typed. Every error names
    the key and what would be valid."""
    raw = dict(raw or {})
    for key in raw:
        if key not in VALID_KEYS:
            close = difflib.get_close_matches(key, VALID_KEYS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"pipeline_config has unknown key {key!r}{hint}; valid keys: {', '.join(VALID_KEYS)}")
    ignored = sorted(k for k in raw if k in IGNORED_NXD_KEYS and raw[k] not in (None, False))
    if ignored:
        warnings.warn(f"pipeline_config keys {ignored} only matter for NxD's FX tracing/XLA and are ignored by nxd",
                      stacklevel=3)
    m = _int("num_microbatches", raw.get("num_microbatches", 1))
    v = _int("virtual_pipeline_size", raw.get("virtual_pipeline_size", 1))
    schedule = raw.get("schedule", DEFAULT_SCHEDULE)
    if not isinstance(schedule, str) or not schedule:
        raise ConfigError(f"pipeline_config.schedule must be a schedule name such as '1f1b', got {schedule!r}")
    schedule = pipeline_schedule(raw.get("schedule"), v)
    cuts = raw.get("pipeline_cuts")
    if cuts is not None:
        if isinstance(cuts, (str, bytes)) or not isinstance(cuts, (list, tuple)):
            raise ConfigError(f"pipeline_config.pipeline_cuts must be a list of layer names or indices, got {cuts!r}")
        cuts = tuple(cuts)
        if pipeline_parallel_size > 1 and len(cuts) != pipeline_parallel_size * v - 1:
            raise ConfigError(
                f"pipeline_config.pipeline_cuts has {len(cuts)} cut(s); pipeline_parallel_size={pipeline_parallel_size}"
                f" x virtual_pipeline_size={v} needs {pipeline_parallel_size * v - 1}"
            )
    method = raw.get("partition_method", "even")
    if method not in ("even", "params"):
        raise ConfigError(f"pipeline_config.partition_method must be 'even' or 'params', got {method!r}")
    auto = raw.get("auto_partition", None)
    if auto is not None and not isinstance(auto, bool):
        raise ConfigError(f"pipeline_config.auto_partition must be True or False, got {auto!r}")
    if auto is True and cuts:
        raise ConfigError("pipeline_config.auto_partition=True conflicts with pipeline_cuts; give one of them")
    layer_cls = raw.get("transformer_layer_cls") or ()
    layer_cls = tuple(layer_cls) if isinstance(layer_cls, (list, tuple)) else (layer_cls,)
    for cls in layer_cls:
        if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
            raise ConfigError(f"pipeline_config.transformer_layer_cls must be nn.Module classes, got {cls!r}")
    spec = raw.get("output_loss_value_spec")
    if spec is not None:
        if not isinstance(spec, (list, tuple)) or sum(bool(x) for x in spec) != 1:
            raise ConfigError(
                "pipeline_config.output_loss_value_spec must be a tuple of booleans with exactly one True "
                f"(marking the loss among the head's outputs), got {spec!r}"
            )
        spec = tuple(bool(x) for x in spec)
    loss_fn = raw.get("loss_fn")
    if loss_fn is not None and not callable(loss_fn):
        raise ConfigError(f"pipeline_config.loss_fn must be callable(output, **batch) -> loss, got {loss_fn!r}")
    bcast = raw.get("broadcast_and_average_loss", False)
    if not isinstance(bcast, bool):
        raise ConfigError(f"pipeline_config.broadcast_and_average_loss must be True or False, got {bcast!r}")
    return PipelineConfig(m, schedule, v, cuts, method, layer_cls, spec, loss_fn, bcast)
