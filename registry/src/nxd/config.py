"""``neuronx_distributed_config``: NxD's global training config, validated before anything runs."""

from __future__ import annotations

import difflib
import numbers
from typing import Any

import torch

from nxd.dtypes import dtype_name
from nxd.errors import ComponentNotFound, ConfigError, PluginError
from nxd.lookup import get_component
from nxd.parallel import ParallelContext, current_parallel_context, set_parallel_context
from nxd.plugins import state
from nxd.resolved import DEFAULT_MODEL_INIT_CONFIG, DEFAULT_OPTIMIZER_CONFIG, NxdConfig
from nxd.run_config import (
    DEFAULT_COMPILE_CONFIG,
    DEFAULT_DATA_PARALLEL_STRATEGY,
    ZERO1_STRATEGY,
    RunConfig,
)

CONFIG_MARKER = "_nxd_config_version"


def _suggest(key: str, valid: list[str]) -> str:
    close = difflib.get_close_matches(key, valid, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _merge(field: str, given: dict | None, defaults: dict[str, Any], extra_keys: tuple[str, ...] = ()) -> dict:
    if given is None:
        return dict(defaults)
    if not isinstance(given, dict):
        raise ConfigError(f"{field} must be a dict, got {type(given).__name__}")
    valid = list(defaults) + list(extra_keys)
    for key in given:
        if key not in valid:
            raise ConfigError(f"{field} has unknown key {key!r}{_suggest(key, valid)}; valid keys: {', '.join(valid)}")
    return {**defaults, **given}


def _positive_int(field: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ConfigError(f"{field} must be a positive integer, got {value!r}")
    return int(value)


def _bool(field: str, value: Any) -> bool:
    # 0 / 1 too: NxD's examples pass their integer command-line flags (``--use_sequence_parallel 1``)
    if not isinstance(value, bool) and not (isinstance(value, numbers.Integral) and value in (0, 1)):
        raise ConfigError(f"{field} must be True or False, got {value!r}")
    return bool(value)


def _compile(value: Any) -> dict | None:
    """``compile_config``: None/False (eager), True (inductor defaults) or a dict of torch.compile arguments."""
    if value is None or value is False:
        return None
    if value is True:
        return dict(DEFAULT_COMPILE_CONFIG)
    merged = _merge("compile_config", value, DEFAULT_COMPILE_CONFIG)
    _bool("compile_config.fullgraph", merged["fullgraph"])
    if not isinstance(merged["backend"], str) and not callable(merged["backend"]):
        raise ConfigError(f"compile_config.backend must be a backend name (e.g. 'inductor') or callable, "
                          f"got {merged['backend']!r}")
    return merged


def _mixed_precision(given: Any, zero1: bool) -> dict[str, Any]:
    """NxD's derivation: missing keys follow ZeRO-1 (master weights and fp32 gradient accumulation
    on with it, off without); master weights in checkpoints default off. Other keys (e.g. nxd-zero1's
    ``stochastic_rounding``) are kept for the optimizer plugin to check."""
    if given is None:
        given = {}
    if not isinstance(given, dict):
        raise ConfigError(f"mixed_precision_config must be a dict, got {type(given).__name__}")
    # without ZeRO-1 a key set True is refused by RunConfig (NxD raises it at initialize_parallel_optimizer)
    return {"use_master_weights": zero1, "use_fp32_grad_acc": zero1, "use_master_weights_in_ckpt": False, **given}


def neuronx_distributed_config(
    tensor_parallel_size: int = 1,
    pipeline_parallel_size: int = 1,
    pipeline_config: dict | None = None,
    optimizer_config: dict | None = None,
    activation_checkpoint_config: Any = None,
    pad_model: bool = False,
    sequence_parallel: bool = False,
    model_init_config: dict | None = None,
    lora_config: Any = None,
    mixed_precision_config: dict | None = None,
    expert_parallel_size: int = 1,
    context_parallel_size: int = 1,
    lnc_size: int = 1,
    compile_config: dict | bool | None = None,
    data_parallel_strategy: str | None = None,
    fsdp_config: dict | bool | None = None,
    model_transforms: dict[str, Any] | None = None,
    parallel_layers_reduce_dtype: Any = None,
) -> NxdConfig:
    """Validate NxD's training config, initialise model parallelism when ``torch.distributed`` is
    up, and return the resolved config: an :class:`nxd.resolved.NxdConfig`, NxD's dict with typed
    attributes (every hook and transform receives it).

    Every feature resolves its plugin here, so a missing one fails now with the distribution to
    install, not later inside a training step. ``compile_config`` (an nxd addition) compiles each
    transformer block with ``torch.compile``: True, or a dict of backend/mode/fullgraph/dynamic.
    ``data_parallel_strategy`` (an nxd addition) names the registered data-parallel strategy
    (``ddp``, ``zero1``, ``fsdp``, ...); unset, ``optimizer_config.zero_one_enabled`` picks ``zero1``
    or ``ddp``. ``fsdp_config`` (an nxd addition; NxD has no FSDP) selects the ``fsdp`` strategy
    (nxd-fsdp): True for its defaults or a dict of its settings, which nxd-fsdp validates
    (docs/fsdp.md). ``model_transforms`` (an nxd addition) turns on registered model transforms that
    no NxD argument names, with their options: ``{"fp8": {...}, "acme_recipe": True}``; each must
    be installed (a transform reads its options with ``config.transform_options(name)``).
    ``parallel_layers_reduce_dtype`` (an nxd addition; NxDT's ``precision`` key of that name):
    ``torch.float32``/``torch.bfloat16`` (or ``"fp32"``/``"bf16"``), the dtype the tensor-parallel
    linear layers that the parallel plan makes sum their partial results in (``None``: fp32).
    """
    tp = _positive_int("tensor_parallel_size", tensor_parallel_size)
    pp = _positive_int("pipeline_parallel_size", pipeline_parallel_size)
    ep = _positive_int("expert_parallel_size", expert_parallel_size)
    cp = _positive_int("context_parallel_size", context_parallel_size)  # any size: the model spec decides (CP)
    # expert_parallel_size > 1 splits MoE experts (nxd-moe) over ranks of the data-parallel group;
    # the parallel context checks that it divides the DP size
    _positive_int("lnc_size", lnc_size)
    optimizer = _merge("optimizer_config", optimizer_config, DEFAULT_OPTIMIZER_CONFIG)
    _bool("optimizer_config.zero_one_enabled", optimizer["zero_one_enabled"])
    _bool("optimizer_config.grad_clipping", optimizer["grad_clipping"])
    max_norm = optimizer["max_grad_norm"]
    if isinstance(max_norm, bool) or not isinstance(max_norm, numbers.Real) or max_norm <= 0:
        raise ConfigError(f"optimizer_config.max_grad_norm must be a positive number, got {max_norm!r}")
    model_init = _merge("model_init_config", model_init_config, DEFAULT_MODEL_INIT_CONFIG)
    factor = model_init["sequential_move_factor"]
    if isinstance(factor, bool) or not isinstance(factor, int) or not 1 <= factor <= 32:
        raise ConfigError(f"model_init_config.sequential_move_factor must be an integer in 1..32, got {factor!r}")
    _bool("model_init_config.meta_device_init", model_init["meta_device_init"])
    if model_init["meta_device_init"] and not callable(model_init["param_init_fn"]):
        raise ConfigError("model_init_config.param_init_fn must be a callable when meta_device_init is True")
    if pipeline_config is not None and not isinstance(pipeline_config, dict):
        raise ConfigError(f"pipeline_config must be a dict, got {type(pipeline_config).__name__}")
    if data_parallel_strategy is not None and (not isinstance(data_parallel_strategy, str) or not data_parallel_strategy):
        raise ConfigError(f"data_parallel_strategy must be a registered strategy's name (e.g. 'ddp'), "
                          f"got {data_parallel_strategy!r}")
    reduce_dtype = dtype_name(parallel_layers_reduce_dtype, "parallel_layers_reduce_dtype",
                              allowed=(torch.float32, torch.bfloat16))
    # NxD's dict; its RunConfig (what every hook, transform and optimizer gets) checks the values
    # together (strategy, precision, checkpointing)
    config = NxdConfig({
        "tensor_parallel_size": tp,
        "pipeline_parallel_size": pp,
        "pipeline_config": dict(pipeline_config or {}),
        "optimizer_config": optimizer,
        "activation_checkpoint_config": activation_checkpoint_config,
        "pad_model": _bool("pad_model", pad_model),
        "sequence_parallel": _bool("sequence_parallel", sequence_parallel),
        "model_init_config": model_init,
        "lora_config": lora_config,
        "mixed_precision_config": _mixed_precision(mixed_precision_config, optimizer["zero_one_enabled"]),
        "expert_parallel_size": ep,
        "context_parallel_size": cp,
        "lnc_size": lnc_size,
        "compile_config": _compile(compile_config),
        "data_parallel_strategy": data_parallel_strategy,
        "fsdp_config": _fsdp_config(fsdp_config),
        "model_transforms": _model_transforms(model_transforms),
        "parallel_layers_reduce_dtype": reduce_dtype,
        CONFIG_MARKER: 1,
    })
    run = config.run
    dict.__setitem__(config, "data_parallel_strategy", run.data_parallel_strategy)  # NxD's dict shows the one that applies
    check_run_config(run)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        initialize_parallel(run)
    return config


def _fsdp_config(value: Any) -> dict | None:
    """``fsdp_config``: None/False (off), True (the plugin's defaults: ``{}``) or a dict of settings."""
    if value is None or value is False:
        return None
    if value is True:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"fsdp_config must be True, False or a dict of FSDP settings (docs/fsdp.md), got {value!r}")
    return dict(value)


def _model_transforms(value: Any) -> dict[str, dict]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"model_transforms must be a dict of transform name -> options, got {type(value).__name__}")
    out: dict[str, dict] = {}
    for name, options in value.items():
        if options is None or options is True:
            options = {}
        if not isinstance(name, str) or not isinstance(options, dict):
            raise ConfigError(f"model_transforms[{name!r}] must be a dict of options (or True), got {options!r}")
        out[name] = dict(options)
    return out


def check_run_config(config: RunConfig) -> None:
    """What the sections cannot check alone: every plugin the config needs is installed, and each
    plugin's ``nxd_validate_config`` accepts it. Called once per run, before anything runs."""
    for name in config.model_transforms:
        get_component("model_transform", name, need=f"model_transforms[{name!r}]")
    pp = config.pipeline_parallel_size
    if pp > 1:
        get_component("pipeline_schedule", config.pipeline_schedule, need=f"pipeline_parallel_size={pp}")
    strategy = config.data_parallel_strategy
    if strategy != DEFAULT_DATA_PARALLEL_STRATEGY:  # the default comes with the runtime (nxd-core-parallel)
        need = ("optimizer_config.zero_one_enabled=True" if strategy == ZERO1_STRATEGY
                else f"data_parallel_strategy={strategy!r}")
        get_component("model_transform", strategy, need=need)
    lora = config.lora_config
    if lora is not None and getattr(lora, "enable_lora", True):
        get_component("adapter", "lora", need="lora_config")
    state().call_each("nxd_validate_config", optional=True, nxd_config=config)  # a crashing validator is named, skipped


def initialize_parallel(config: RunConfig) -> ParallelContext:
    """Set up process groups for ``config`` through the ``nxd_initialize_parallel`` hook and make
    the returned :class:`~nxd.parallel.ParallelContext` current. A current context of the same
    sizes (e.g. ``nxd train`` built it first, with its timeout) is kept: groups start once."""
    current = current_parallel_context()
    if current is not None and _same_sizes(current, config):
        return current
    context = state().pm.hook.nxd_initialize_parallel(nxd_config=config)
    if context is None:
        raise ComponentNotFound(
            "setting up tensor/pipeline/data parallel groups needs a parallel runtime plugin: "
            "pip install nxd-core-parallel"
        )
    if not isinstance(context, ParallelContext):
        raise PluginError(
            f"nxd_initialize_parallel must return the nxd.parallel.ParallelContext it built, got {type(context).__name__}"
        )
    if current_parallel_context() is not context:
        set_parallel_context(context)
    return context


def _same_sizes(context: ParallelContext, config: RunConfig) -> bool:
    if context.world_size != torch.distributed.get_world_size():
        return False
    return all(context.dim(name).size == size for name, size in config.sizes().items())


def check_config(nxd_config: Any) -> RunConfig:
    """The :class:`RunConfig` of a run's config: itself, or the one :func:`neuronx_distributed_config`
    returned (a copy of NxD's dict made by hand or pickled as a plain dict is read again); anything
    else is refused."""
    if isinstance(nxd_config, RunConfig):
        return nxd_config
    if not isinstance(nxd_config, dict) or CONFIG_MARKER not in nxd_config:
        raise ConfigError(
            "nxd_config must be the dict returned by nxd.neuronx_distributed_config(...), "
            f"got {type(nxd_config).__name__}"
        )
    return RunConfig.of(nxd_config)
