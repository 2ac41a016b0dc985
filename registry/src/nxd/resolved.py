"""NxD's config dict as an adapter over the run's typed config: :class:`NxdConfig`.

``neuronx_distributed_config`` returns one: NxD's dict (a ``dict`` subclass: NxD code that
indexes it, copies it or checks ``isinstance(cfg, dict)`` keeps working) whose ``run`` is the
:class:`nxd.run_config.RunConfig` every hook, transform and optimizer receives; its typed
attributes are that RunConfig's. NxD's key names, defaults and renames live here once
(:func:`run_config_from_nxd`): ``optimizer_config.grad_clipping=False`` is
``optimizer.max_grad_norm=None`` from here on. nxd's own code reads the RunConfig, never string keys.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nxd.run_config import (  # noqa: F401 - NxD-facing names kept importable from here
    DEFAULT_COMPILE_CONFIG,
    DEFAULT_DATA_PARALLEL_STRATEGY,
    DEFAULT_PIPELINE_SCHEDULE,
    DEFAULT_VIRTUAL_PIPELINE_SCHEDULE,
    ZERO1_STRATEGY,
    ModelInitConfig,
    OptimizerConfig,
    Parallelism,
    RunConfig,
    default_data_parallel_strategy,
    pipeline_schedule,
)

#: NxD's optimizer_config keys and defaults (``grad_clipping`` and ``max_grad_norm`` are one value in RunConfig)
DEFAULT_OPTIMIZER_CONFIG: dict[str, Any] = {"zero_one_enabled": False, "grad_clipping": True, "max_grad_norm": 1.0}
DEFAULT_MODEL_INIT_CONFIG: dict[str, Any] = {"sequential_move_factor": 11, "meta_device_init": False,
                                             "param_init_fn": None}
#: the config keys of the parallel sizes, by the parallel context's dimension names
SIZE_KEYS = {"tp": "tensor_parallel_size", "pp": "pipeline_parallel_size", "cp": "context_parallel_size",
             "ep": "expert_parallel_size"}


def run_config_from_nxd(value: Mapping[str, Any]) -> RunConfig:
    """The :class:`RunConfig` of NxD's config dict (or a partial one: the defaults fill the rest)."""
    from nxd.dtypes import dtype_name

    optimizer = {**DEFAULT_OPTIMIZER_CONFIG, **(value.get("optimizer_config") or {})}
    init = {**DEFAULT_MODEL_INIT_CONFIG, **(value.get("model_init_config") or {})}
    return RunConfig(
        parallel=Parallelism(tp=value.get("tensor_parallel_size", 1), pp=value.get("pipeline_parallel_size", 1),
                             cp=value.get("context_parallel_size", 1), ep=value.get("expert_parallel_size", 1),
                             lnc=value.get("lnc_size", 1), sequence_parallel=bool(value.get("sequence_parallel", False)),
                             pad_model=bool(value.get("pad_model", False))),
        # NxD's rule: clipping on with a norm > 0; off is one value here, None
        optimizer=OptimizerConfig(zero_one_enabled=bool(optimizer["zero_one_enabled"]),
                                  max_grad_norm=optimizer["max_grad_norm"] if optimizer["grad_clipping"] else None),
        model_init=ModelInitConfig(sequential_move_factor=init["sequential_move_factor"],
                                   meta_device_init=bool(init["meta_device_init"]), param_init_fn=init["param_init_fn"]),
        pipeline_config=dict(value.get("pipeline_config") or {}),
        activation_checkpoint_config=value.get("activation_checkpoint_config"),
        lora_config=value.get("lora_config"),
        mixed_precision_config=value.get("mixed_precision_config"),
        compile_config=value.get("compile_config"),
        data_parallel_strategy=value.get("data_parallel_strategy") or "",
        fsdp_config=value.get("fsdp_config"),
        model_transforms=dict(value.get("model_transforms") or {}),
        reduce_dtype=dtype_name(value.get("parallel_layers_reduce_dtype"), "parallel_layers_reduce_dtype"),
    )


class NxdConfig(dict):
    """NxD's resolved training config: its dict, with the typed :class:`RunConfig` it was made
    from as ``run``; ``cfg.tensor_parallel_size`` and ``cfg["tensor_parallel_size"]`` are the same
    value, sub-configs are typed (``cfg.optimizer.max_grad_norm``)."""

    @property
    def run(self) -> RunConfig:
        cached = self.__dict__.get("_run")
        if cached is None:
            cached = run_config_from_nxd(self)
            self.__dict__["_run"] = cached
        return cached

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.run, name)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"NxdConfig.{name} is read-only; build a new config with neuronx_distributed_config")

    def __eq__(self, other: object) -> bool:
        # NxD code compares what it passed with what a wrapper keeps (``model.nxd_config == cfg``);
        # nxd's wrappers keep the RunConfig
        return self.run == other if isinstance(other, RunConfig) else dict.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = None  # type: ignore[assignment]  # a dict

    @classmethod
    def of(cls, value: Mapping[str, Any] | None) -> NxdConfig:
        """``value`` as an :class:`NxdConfig` (itself when it is one; ``None`` is the default config;
        a :class:`RunConfig`, what hooks receive: an NxdConfig reading it, its attributes only)."""
        if isinstance(value, RunConfig):
            config = cls()
            config.__dict__["_run"] = value
            return config
        return value if isinstance(value, NxdConfig) else cls(value or {})
