"""The resolved NxD config every hook, transform and rank receives: :class:`NxdConfig`.

``neuronx_distributed_config`` (Python) and ``nxd train`` (YAML, through the same call) return one.
It is NxD's dict (a ``dict`` subclass: NxD code that indexes it, copies it or checks
``isinstance(cfg, dict)`` keeps working) with typed, read-only attributes; nxd's own code reads
the attributes, never string keys. Defaults live here once: a partial dict (tests, NxD code that
builds one by hand) read through :meth:`NxdConfig.of` answers every attribute.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Generic, TypeVar

T = TypeVar("T")

DEFAULT_OPTIMIZER_CONFIG: dict[str, Any] = {"zero_one_enabled": False, "grad_clipping": True, "max_grad_norm": 1.0}
DEFAULT_MODEL_INIT_CONFIG: dict[str, Any] = {
    "sequential_move_factor": 11,
    "meta_device_init": False,
    "param_init_fn": None,
}
#: compile_config (an nxd addition): torch.compile arguments applied to each transformer block
DEFAULT_COMPILE_CONFIG: dict[str, Any] = {"backend": "inductor", "mode": None, "fullgraph": False, "dynamic": None}
#: the data-parallel strategy (a model transform with an optimizer side) when none is named:
#: NxD's ``optimizer_config.zero_one_enabled`` selects ``zero1``, otherwise ``ddp``
DEFAULT_DATA_PARALLEL_STRATEGY = "ddp"
ZERO1_STRATEGY = "zero1"
#: the pipeline schedule when ``pipeline_config.schedule`` (YAML: ``distributed_strategy.pipeline_schedule``) is unset
DEFAULT_PIPELINE_SCHEDULE = "1f1b"
#: NxD picks the interleaved schedule whenever virtual stages are asked for and no schedule is named
DEFAULT_VIRTUAL_PIPELINE_SCHEDULE = "interleaved_1f1b"


def default_data_parallel_strategy(zero_one_enabled: bool) -> str:
    """The strategy when none is named: NxD's ``zero_one_enabled`` flag picks ZeRO-1."""
    return ZERO1_STRATEGY if zero_one_enabled else DEFAULT_DATA_PARALLEL_STRATEGY


def pipeline_schedule(name: str | None, virtual_pipeline_size: int = 1) -> str:
    """The registered pipeline schedule a run uses: ``name``, or the default when unset."""
    if name:
        return name
    return DEFAULT_VIRTUAL_PIPELINE_SCHEDULE if virtual_pipeline_size > 1 else DEFAULT_PIPELINE_SCHEDULE


class _Key(Generic[T]):
    """A read-only attribute backed by the dict key of the same name, with its default."""

    def __init__(self, default: T) -> None:
        self.default = default

    def __set_name__(self, owner: type, name: str) -> None:
        self.key = name

    def __get__(self, obj: Any, owner: type | None = None) -> T:
        if obj is None:
            return self  # type: ignore[return-value]
        return obj.get(self.key, self.default)

    def __set__(self, obj: Any, value: Any) -> None:
        raise AttributeError(f"NxdConfig.{self.key} is read-only; build a new config with neuronx_distributed_config")


@dataclass(frozen=True)
class OptimizerConfig:
    zero_one_enabled: bool = False
    grad_clipping: bool = True
    max_grad_norm: float = 1.0


@dataclass(frozen=True)
class ModelInitConfig:
    sequential_move_factor: int = 11
    meta_device_init: bool = False
    param_init_fn: Any = None


#: the config keys of the parallel sizes, by the parallel context's dimension names
SIZE_KEYS = {"tp": "tensor_parallel_size", "pp": "pipeline_parallel_size", "cp": "context_parallel_size",
             "ep": "expert_parallel_size"}


class NxdConfig(dict):
    """NxD's resolved training config, typed. ``cfg.tensor_parallel_size`` and
    ``cfg["tensor_parallel_size"]`` are the same value; sub-configs are typed objects as
    attributes (``cfg.optimizer.max_grad_norm``) and NxD's dicts as keys."""

    tensor_parallel_size: _Key[int] = _Key(1)
    pipeline_parallel_size: _Key[int] = _Key(1)
    context_parallel_size: _Key[int] = _Key(1)
    expert_parallel_size: _Key[int] = _Key(1)
    lnc_size: _Key[int] = _Key(1)
    sequence_parallel: _Key[bool] = _Key(False)
    pad_model: _Key[bool] = _Key(False)
    #: None, "full", or nn.Module classes to recompute
    activation_checkpoint_config: _Key[Any] = _Key(None)
    #: nxd-lora's LoraConfig (or a dict of its fields), or None
    lora_config: _Key[Any] = _Key(None)
    #: torch.compile arguments per transformer block, or None (eager)
    compile_config: _Key[dict[str, Any] | None] = _Key(None)
    #: nxd-fsdp's settings when FSDP is the data-parallel strategy (the plugin types them), or None
    fsdp_config: _Key[dict[str, Any] | None] = _Key(None)
    #: registered transforms no NxD argument names, by name, with their options (read them with transform_options)
    model_transforms: _Key[Mapping[str, dict[str, Any]]] = _Key(MappingProxyType({}))

    @classmethod
    def of(cls, value: Mapping[str, Any] | None) -> NxdConfig:
        """``value`` as an :class:`NxdConfig` (itself when it is one; ``None`` is the default config)."""
        return value if isinstance(value, NxdConfig) else cls(value or {})

    @classmethod
    def for_context(cls, value: Mapping[str, Any] | None, context: Any) -> NxdConfig:
        """:meth:`of` ``value``, the parallel sizes it leaves out read from ``context`` (a
        :class:`nxd.parallel.ParallelContext`, or ``None``): a partial config describes the world
        the model is parallelised for, so transforms that apply by size see that world's sizes."""
        config = cls.of(value)
        missing = {} if context is None else {key: context.dim(dim).size for dim, key in SIZE_KEYS.items()
                                              if key not in config}
        return cls({**config, **missing}) if missing else config

    @property
    def pipeline_config(self) -> dict[str, Any]:
        """The pipeline plugin's options (nxd-pipeline types them: ``parse_pipeline_config``)."""
        return self.get("pipeline_config") or {}

    @property
    def pipeline_schedule(self) -> str:
        """The registered pipeline schedule that runs when ``pipeline_parallel_size > 1``."""
        pipeline = self.pipeline_config
        return pipeline_schedule(pipeline.get("schedule"), pipeline.get("virtual_pipeline_size") or 1)

    @property
    def optimizer(self) -> OptimizerConfig:
        return OptimizerConfig(**{**DEFAULT_OPTIMIZER_CONFIG, **(self.get("optimizer_config") or {})})

    @property
    def model_init(self) -> ModelInitConfig:
        return ModelInitConfig(**{**DEFAULT_MODEL_INIT_CONFIG, **(self.get("model_init_config") or {})})

    @property
    def mixed_precision_config(self) -> dict[str, Any] | None:
        """NxD's mixed_precision_config (the ZeRO-1 plugin types and checks its keys)."""
        return self.get("mixed_precision_config")

    @property
    def data_parallel_strategy(self) -> str:
        """The registered data-parallel strategy that applies (``ddp``, ``zero1``, ...)."""
        return self.get("data_parallel_strategy") or default_data_parallel_strategy(self.optimizer.zero_one_enabled)

    @property
    def parallel_layers_reduce_dtype(self) -> Any:
        """The ``torch.dtype`` the tensor-parallel linear layers sum their partial results in (an
        nxd addition; NxDT's ``precision.parallel_layers_reduce_dtype``), or ``None`` (the layers'
        default, fp32). Applied when the parallel plan makes the layers."""
        from nxd.dtypes import torch_dtype

        return torch_dtype(self.get("parallel_layers_reduce_dtype"))

    def transform_options(self, name: str) -> dict[str, Any] | None:
        """The options ``neuronx_distributed_config(model_transforms={name: ...})`` gave the
        transform ``name``; ``None`` when the config does not turn it on."""
        options = (self.model_transforms or {}).get(name)
        return None if options is None else dict(options)

    def sizes(self) -> dict[str, int]:
        """The parallel sizes in the parallel context's dimension names."""
        return {dim: getattr(self, key) for dim, key in SIZE_KEYS.items()}
