"""The run's one typed config: :class:`RunConfig`, a frozen tree of sections owned by the core.

Every hook, transform, optimizer factory and rank receives a ``RunConfig``. It is built once per
run, by one translator: ``nxd train`` translates the NxDT YAML (nxd-training's
``nxd_training.config.nxdt``), NxD's ``neuronx_distributed_config`` translates its keyword
arguments (:mod:`nxd.config`, which wraps the result in NxD's dict, :class:`nxd.resolved.NxdConfig`).
Each section checks its own values when it is made; what needs several sections is checked in
:meth:`RunConfig.__post_init__`. A value has one name from here on (``optimizer.max_grad_norm``:
the clipping norm, ``None`` for no clipping).

The attributes under NxD's names (``tensor_parallel_size``, ``sequence_parallel``,
``pipeline_config``, ...) read the sections; plugins written against NxD's config keep working.
:meth:`to_record` / :meth:`from_record` write and read the JSON form a run folder holds.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from nxd.errors import ConfigError

#: the data-parallel strategy when none is named: NxD's ``zero_one_enabled`` picks ``zero1``, else ``ddp``
DEFAULT_DATA_PARALLEL_STRATEGY = "ddp"
ZERO1_STRATEGY = "zero1"
#: ``fsdp_config`` selects this strategy; its keys belong to the plugin (nxd-fsdp)
FSDP_STRATEGY = "fsdp"
#: the pipeline schedule when ``pipeline_config.schedule`` is unset
DEFAULT_PIPELINE_SCHEDULE = "1f1b"
#: NxD picks the interleaved schedule whenever virtual stages are asked for and no schedule is named
DEFAULT_VIRTUAL_PIPELINE_SCHEDULE = "interleaved_1f1b"
#: torch.compile arguments applied to each transformer block (an nxd addition)
DEFAULT_COMPILE_CONFIG: dict[str, Any] = {"backend": "inductor", "mode": None, "fullgraph": False, "dynamic": None}
#: mixed_precision_config keys only the ZeRO-1 optimizer honours
MIXED_PRECISION_ZERO1_KEYS = ("use_master_weights", "use_fp32_grad_acc", "use_master_weights_in_ckpt")
#: the parallel sizes by the parallel context's dimension names
DIMENSIONS = ("tp", "pp", "cp", "ep")


def default_data_parallel_strategy(zero_one_enabled: bool) -> str:
    """The strategy when none is named: NxD's ``zero_one_enabled`` flag picks ZeRO-1."""
    return ZERO1_STRATEGY if zero_one_enabled else DEFAULT_DATA_PARALLEL_STRATEGY


def pipeline_schedule(name: str | None, virtual_pipeline_size: int = 1) -> str:
    """The registered pipeline schedule a run uses: ``name``, or the default when unset."""
    if name:
        return name
    return DEFAULT_VIRTUAL_PIPELINE_SCHEDULE if virtual_pipeline_size > 1 else DEFAULT_PIPELINE_SCHEDULE


def sequence_parallel_built_for(model: Any) -> bool | None:
    """The sequence-parallel setting ``model`` was built for: a bool its constructor set on the
    instance (its norms and masks run on sequence shards), else ``None``. A class default is no
    such statement: a plain family's modules (``PlacedByPlan``) run on whole sequences until the
    ``parallel_plan`` transform places them with the config's setting, the one decision."""
    value = vars(model).get("sequence_parallel") if hasattr(model, "__dict__") else None
    return value if isinstance(value, bool) else None


def _positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")


def _bool(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ConfigError(f"{name} must be True or False, got {value!r}")


@dataclass(frozen=True)
class Parallelism:
    """The parallel sizes (the data-parallel size is what the world leaves) and the layout switches."""

    tp: int = 1
    pp: int = 1
    cp: int = 1
    #: splits MoE experts over ranks of the data-parallel group (the parallel context checks it divides DP)
    ep: int = 1
    lnc: int = 1
    sequence_parallel: bool = False
    pad_model: bool = False

    def __post_init__(self) -> None:
        for name in (*DIMENSIONS, "lnc"):
            _positive_int(f"parallel.{name}", getattr(self, name))
        _bool("parallel.sequence_parallel", self.sequence_parallel)
        _bool("parallel.pad_model", self.pad_model)


@dataclass(frozen=True)
class OptimizerConfig:
    """What the data-parallel strategy's optimizer does around the inner step."""

    zero_one_enabled: bool = False
    #: clip the whole model's gradient norm to this before each step; ``None``: no clipping
    max_grad_norm: float | None = 1.0

    def __post_init__(self) -> None:
        _bool("optimizer.zero_one_enabled", self.zero_one_enabled)
        norm = self.max_grad_norm
        if norm is not None and (isinstance(norm, bool) or not isinstance(norm, numbers.Real) or norm <= 0):
            raise ConfigError(f"optimizer.max_grad_norm must be a positive number (None: no clipping), got {norm!r}")


@dataclass(frozen=True)
class ModelInitConfig:
    """How the model's tensors come into being."""

    sequential_move_factor: int = 11
    #: build on the meta device, then materialise (``param_init_fn``; ``None``: each module's own
    #: ``reset_parameters``, the runtime's default)
    meta_device_init: bool = False
    param_init_fn: Any = None

    def __post_init__(self) -> None:
        factor = self.sequential_move_factor
        if isinstance(factor, bool) or not isinstance(factor, int) or not 1 <= factor <= 32:
            raise ConfigError(f"model_init.sequential_move_factor must be an integer in 1..32, got {factor!r}")
        _bool("model_init.meta_device_init", self.meta_device_init)
        if self.param_init_fn is not None and not callable(self.param_init_fn):
            raise ConfigError(f"model_init.param_init_fn must be callable, got {self.param_init_fn!r}")


@dataclass(frozen=True)
class Derived:
    """What ``nxd train`` derived from its YAML when it resolved the run, once (``None`` for a run
    made through NxD's API): the model it builds, the batch numbers, the data module with the
    section it takes, the workflow. Ranks read these; nothing here is derived again."""

    #: the registered model (``nxd.get_model``) and which key chose it
    architecture: str
    architecture_reason: str
    #: the model plugin's ``config_from_dict`` input
    model: Mapping[str, Any]
    world_size: int
    dp: int
    num_microbatches: int
    seq_length: int
    data_module: str
    #: the ``data`` section as the data module takes it (``validate`` and the build get the same one)
    data: Mapping[str, Any]
    #: the registered workflow (``dpo``, ``orpo``), or None
    workflow: str | None = None
    #: how keys of earlier releases, and keys accepted without effect, were read
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("world_size", "dp", "num_microbatches", "seq_length"):
            _positive_int(f"derived.{name}", getattr(self, name))
        object.__setattr__(self, "notes", tuple(self.notes))


def _activation_checkpoint(value: Any) -> None:
    import torch

    if value is None or value in ("full", "op"):  # "op": nxd's op-level checkpointing of every layer
        return
    classes = value if isinstance(value, (list, tuple)) else [value]
    for cls in classes:
        if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
            raise ConfigError("activation_checkpoint_config must be None, 'full', 'op' (nxd's op-level checkpointing), "
                              f"or an nn.Module class (or a list of them), got {value!r}")


def _compile(value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, Mapping) or set(value) - set(DEFAULT_COMPILE_CONFIG):
        raise ConfigError(f"compile_config must be None or a dict of {', '.join(DEFAULT_COMPILE_CONFIG)}, got {value!r}")
    _bool("compile_config.fullgraph", value.get("fullgraph", False))
    backend = value.get("backend", "inductor")
    if not isinstance(backend, str) and not callable(backend):
        raise ConfigError(f"compile_config.backend must be a backend name (e.g. 'inductor') or callable, got {backend!r}")


@dataclass(frozen=True)
class RunConfig:
    """The resolved run: sections, each valid on its own, checked together here."""

    parallel: Parallelism = field(default_factory=Parallelism)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    model_init: ModelInitConfig = field(default_factory=ModelInitConfig)
    #: the pipeline plugin's options (nxd-pipeline types them: ``parse_pipeline_config``)
    pipeline_config: Mapping[str, Any] = field(default_factory=dict)
    #: None, "full", "op", or nn.Module classes to recompute
    activation_checkpoint_config: Any = None
    #: nxd-lora's LoraConfig (or a dict of its fields), or None
    lora_config: Any = None
    #: NxD's mixed_precision_config (the ZeRO-1 plugin types and checks its keys), or None
    mixed_precision_config: Mapping[str, Any] | None = None
    #: torch.compile arguments per transformer block, or None (eager)
    compile_config: Mapping[str, Any] | None = None
    #: the registered data-parallel strategy (``ddp``, ``zero1``, ``fsdp``, ...); None: NxD's rule
    data_parallel_strategy: str = ""
    #: nxd-fsdp's settings when FSDP is the strategy (the plugin types them), or None
    fsdp_config: Mapping[str, Any] | None = None
    #: registered transforms no NxD argument names, by name, with their options
    model_transforms: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    #: "float32"/"bfloat16": the dtype the tensor-parallel layers sum partial results in; None: fp32
    reduce_dtype: str | None = None
    #: "bfloat16": the model's parameters are built in it; None: the model config's own dtype (fp32)
    param_dtype: str | None = None
    #: "bfloat16": forward passes run under ``torch.autocast`` in it; None: no autocast
    autocast_dtype: str | None = None
    #: what ``nxd train`` derived (model, batch numbers, data, workflow); None through NxD's API
    derived: Derived | None = None

    def __post_init__(self) -> None:
        d = self.derived
        if d is not None and d.world_size != d.dp * self.parallel.tp * self.parallel.pp * self.parallel.cp:
            raise ConfigError(f"derived.world_size={d.world_size} is not DP {d.dp} x TP {self.parallel.tp} x "
                              f"PP {self.parallel.pp} x CP {self.parallel.cp}")
        zero1 = self.optimizer.zero_one_enabled
        if not self.data_parallel_strategy:
            strategy = FSDP_STRATEGY if self.fsdp_config is not None else default_data_parallel_strategy(zero1)
            object.__setattr__(self, "data_parallel_strategy", strategy)
        strategy = self.data_parallel_strategy
        if not isinstance(strategy, str):
            raise ConfigError(f"data_parallel_strategy must be a registered strategy's name (e.g. 'ddp'), got {strategy!r}")
        if self.fsdp_config is not None and zero1:
            raise ConfigError("fsdp_config and optimizer_config.zero_one_enabled=True select two data-parallel strategies "
                              "(FSDP already shards the optimizer state, with the parameters and gradients); set one")
        if zero1 != (strategy == ZERO1_STRATEGY):
            raise ConfigError(f"data_parallel_strategy={strategy!r} contradicts optimizer_config.zero_one_enabled={zero1}: "
                              f"ZeRO-1 is the strategy {ZERO1_STRATEGY!r}; set one of them only")
        if self.fsdp_config is not None and strategy != FSDP_STRATEGY:
            raise ConfigError(f"fsdp_config selects the data-parallel strategy {FSDP_STRATEGY!r}, but "
                              f"data_parallel_strategy={strategy!r}; set one of them only")
        if not zero1:  # NxD raises the same at initialize_parallel_optimizer; here before anything runs
            for key in MIXED_PRECISION_ZERO1_KEYS:
                if (self.mixed_precision_config or {}).get(key) is True:
                    raise ConfigError(f"mixed_precision_config.{key}=True needs optimizer_config.zero_one_enabled=True "
                                      "(NxD keeps fp32 master weights and gradient accumulation in the ZeRO-1 optimizer)")
        _activation_checkpoint(self.activation_checkpoint_config)
        _compile(self.compile_config)
        for name in ("reduce_dtype", "param_dtype", "autocast_dtype"):
            if getattr(self, name) not in (None, "float32", "bfloat16"):
                what = "parallel_layers_reduce_dtype" if name == "reduce_dtype" else name
                raise ConfigError(f"{what} must be float32 or bfloat16, got {getattr(self, name)!r}")

    # ---- NxD's names for the same values (what plugins written against NxD's config read)
    tensor_parallel_size = property(lambda self: self.parallel.tp)
    pipeline_parallel_size = property(lambda self: self.parallel.pp)
    context_parallel_size = property(lambda self: self.parallel.cp)
    expert_parallel_size = property(lambda self: self.parallel.ep)
    lnc_size = property(lambda self: self.parallel.lnc)
    sequence_parallel = property(lambda self: self.parallel.sequence_parallel)
    pad_model = property(lambda self: self.parallel.pad_model)

    @property
    def pipeline_schedule(self) -> str:
        """The registered pipeline schedule that runs when ``pipeline_parallel_size > 1``."""
        return pipeline_schedule(self.pipeline_config.get("schedule"), self.pipeline_config.get("virtual_pipeline_size") or 1)

    @property
    def parallel_layers_reduce_dtype(self) -> Any:
        """The ``torch.dtype`` of :attr:`reduce_dtype`, or ``None`` (the layers' default, fp32)."""
        from nxd.dtypes import torch_dtype

        return torch_dtype(self.reduce_dtype)

    def transform_options(self, name: str) -> dict[str, Any] | None:
        """The options the config gives the transform ``name``; ``None`` when it does not turn it on."""
        options = self.model_transforms.get(name)
        return None if options is None else dict(options)

    def sizes(self) -> dict[str, int]:
        """The parallel sizes in the parallel context's dimension names."""
        return {dim: getattr(self.parallel, dim) for dim in DIMENSIONS}

    # ---- where a RunConfig comes from
    @classmethod
    def of(cls, value: Any) -> RunConfig:
        """``value`` as a :class:`RunConfig`: itself; NxD's config dict (or a partial one, made by hand:
        its defaults fill the rest) through the NxD adapter; ``None``: the defaults."""
        if isinstance(value, RunConfig):
            return value
        run = getattr(value, "run", None)  # nxd.resolved.NxdConfig carries the RunConfig it was made from
        if isinstance(run, RunConfig):
            return run
        from nxd.resolved import run_config_from_nxd

        return run_config_from_nxd(value or {})

    @classmethod
    def for_context(cls, value: Any, context: Any, model: Any = None) -> RunConfig:
        """:meth:`of` ``value``, with what a partial NxD dict (or ``None``) leaves out taken from where
        the model is parallelised: the parallel sizes from ``context`` (so transforms that apply by
        size see them), ``sequence_parallel`` from ``model`` when its constructor built it for a setting
        (:func:`sequence_parallel_built_for`; a plain family states none: its plan places it). The one place a value left unstated is filled; a full config (a
        :class:`RunConfig`, NxD's resolved dict) states every field."""
        config = cls.of(value)
        if isinstance(value, RunConfig) or getattr(value, "run", None) is not None:
            return config
        from nxd.resolved import SIZE_KEYS

        stated = value or {}
        filled: dict[str, Any] = {}
        if context is not None:
            filled = {dim: context.dim(dim).size for dim, key in SIZE_KEYS.items() if key not in stated}
        built_for = sequence_parallel_built_for(model)
        if built_for is not None and "sequence_parallel" not in stated:
            filled["sequence_parallel"] = built_for
        return dataclasses.replace(config, parallel=dataclasses.replace(config.parallel, **filled)) if filled else config

    # ---- the JSON form a run folder holds
    def to_record(self) -> dict[str, Any]:
        """The config as JSON values: classes by name, NxD's LoraConfig by its fields; a callable
        ``param_init_fn`` or compile backend cannot be written (refused, naming it)."""
        if self.model_init.param_init_fn is not None:
            raise ConfigError("model_init.param_init_fn is a callable and cannot be written to the run folder; "
                              "leave it unset (each module's reset_parameters)")
        if self.compile_config and not isinstance(self.compile_config.get("backend", ""), str):
            raise ConfigError("compile_config.backend is a callable and cannot be written to the run folder")
        ac = self.activation_checkpoint_config
        if ac is not None and not isinstance(ac, str):
            ac = [cls.__name__ for cls in (ac if isinstance(ac, (list, tuple)) else [ac])]
        lora = self.lora_config
        return {
            "parallel": dataclasses.asdict(self.parallel),
            "optimizer": dataclasses.asdict(self.optimizer),
            "model_init": {k: v for k, v in dataclasses.asdict(self.model_init).items() if k != "param_init_fn"},
            "pipeline_config": dict(self.pipeline_config),
            "activation_checkpoint_config": ac,
            "lora_config": lora.to_dict() if hasattr(lora, "to_dict") else lora,
            "mixed_precision_config": self.mixed_precision_config,
            "compile_config": self.compile_config,
            "data_parallel_strategy": self.data_parallel_strategy,
            "fsdp_config": self.fsdp_config,
            "model_transforms": {k: dict(v) for k, v in self.model_transforms.items()},
            "reduce_dtype": self.reduce_dtype,
            "param_dtype": self.param_dtype,
            "autocast_dtype": self.autocast_dtype,
            "derived": {**dataclasses.asdict(self.derived), "notes": list(self.derived.notes)} if self.derived else None,
        }

    @classmethod
    def from_record(cls, record: Mapping[str, Any], classes: Mapping[str, type], source: str) -> RunConfig:
        """The config :meth:`to_record` wrote. Activation-checkpoint class names are looked up in
        ``classes`` (the model's own: nothing is imported by a name from the file); every section
        checks its values again, naming ``source``."""
        try:
            ac = record.get("activation_checkpoint_config")
            if isinstance(ac, list):
                unknown = [name for name in ac if name not in classes]
                if unknown:
                    raise ConfigError(f"activation_checkpoint_config names {unknown}, which the model does not have")
                ac = [classes[name] for name in ac]
            return cls(parallel=Parallelism(**record["parallel"]), optimizer=OptimizerConfig(**record["optimizer"]),
                       model_init=ModelInitConfig(**record["model_init"]),
                       pipeline_config=dict(record.get("pipeline_config") or {}), activation_checkpoint_config=ac,
                       lora_config=record.get("lora_config"),
                       mixed_precision_config=record.get("mixed_precision_config"),
                       compile_config=record.get("compile_config"),
                       data_parallel_strategy=record["data_parallel_strategy"],
                       fsdp_config=record.get("fsdp_config"), model_transforms=dict(record.get("model_transforms") or {}),
                       reduce_dtype=record.get("reduce_dtype"), param_dtype=record.get("param_dtype"),
                       autocast_dtype=record.get("autocast_dtype"),
                       derived=Derived(**record["derived"]) if record.get("derived") else None)
        except (ConfigError, KeyError, TypeError, AttributeError) as exc:
            raise ConfigError(f"{source}: the run's config is not one nxd wrote ({type(exc).__name__}: {exc})") from None
