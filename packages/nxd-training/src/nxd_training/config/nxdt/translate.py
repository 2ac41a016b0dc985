"""NxDT's YAML sections -> the core's typed :class:`nxd.run_config.RunConfig`: the one translator.

Called once per run, when the config is resolved (``resolve_config``); the result is written to
the run folder (``resolved`` in ``<run>/config.yaml``) and every rank reads it back
(``load_resolved``): no rank translates or validates it again. NxDT's names stop here:
``trainer.gradient_clip_val`` (0 or null: no clipping) is ``optimizer.max_grad_norm`` (None: no
clipping) downstream, ``distributed_strategy.*_model_parallel_size`` are ``parallel.tp/pp/ep``, ...
"""

from __future__ import annotations

from typing import Any

from nxd import ConfigError
from nxd.run_config import DEFAULT_COMPILE_CONFIG, Derived, ModelInitConfig, OptimizerConfig, Parallelism, RunConfig
from nxd_training.config.nxdt.precision import (
    AUTOCAST_TYPES,
    BF16_PARAM_TYPES,
    STOCHASTIC_ROUNDING_TYPES,
    model_transforms,
    parallel_layers_reduce_dtype,
    uses_master_weights,
)
from nxd_training.config.schema import CheckpointCallbackParams, PrecisionConfig, TrainingConfig


def mixed_precision_config(p: PrecisionConfig, ckpt: CheckpointCallbackParams) -> dict[str, Any]:
    """NxD's ``mixed_precision_config`` (ZeRO-1 runs), from ``precision``."""
    master = uses_master_weights(p)
    grad_acc = p.fp32_grad_acc if p.fp32_grad_acc is not None else master
    sr = p.type in STOCHASTIC_ROUNDING_TYPES or bool(p.neuron_rt_stochastic_rounding_en)
    return {
        "use_master_weights": bool(master),
        "use_fp32_grad_acc": bool(grad_acc),
        "use_master_weights_in_ckpt": ckpt.use_master_weights_in_ckpt,
        "stochastic_rounding": sr,
    }


def _compile(value: bool | dict[str, Any]) -> dict[str, Any] | None:
    if value is False or value is None:
        return None
    options = {} if value is True else dict(value)
    unknown = set(options) - set(DEFAULT_COMPILE_CONFIG)
    if unknown:
        raise ConfigError(f"trainer.compile: unknown key(s) {sorted(unknown)}; valid: {', '.join(DEFAULT_COMPILE_CONFIG)}")
    return {**DEFAULT_COMPILE_CONFIG, **options}


def run_config(config: TrainingConfig, derived: Derived, activation_checkpoint: Any, lora: Any) -> RunConfig:
    """The run's :class:`RunConfig` from its sections and what resolution derived (the numbers, the
    activation-checkpoint classes, the ``peft`` section's LoraConfig), each computed once."""
    ds, tr = config.distributed_strategy, config.trainer
    pipeline: dict[str, Any] = {}
    if ds.pipeline_model_parallel_size > 1:
        pipeline = {"num_microbatches": derived.num_microbatches}
        if ds.pipeline_schedule:  # unset: the default schedule (nxd.run_config.pipeline_schedule)
            pipeline["schedule"] = ds.pipeline_schedule
        if (ds.virtual_pipeline_model_parallel_size or 1) > 1:
            pipeline["virtual_pipeline_size"] = ds.virtual_pipeline_model_parallel_size
        if config.model.pipeline_cuts:
            pipeline["pipeline_cuts"] = list(config.model.pipeline_cuts)
    reduce = parallel_layers_reduce_dtype(config.precision)
    return RunConfig(
        parallel=Parallelism(tp=ds.tensor_model_parallel_size, pp=ds.pipeline_model_parallel_size,
                             cp=ds.context_parallel_size, ep=ds.expert_model_parallel_size,
                             sequence_parallel=ds.sequence_parallel),
        optimizer=OptimizerConfig(zero_one_enabled=ds.zero1, max_grad_norm=float(tr.gradient_clip_val or 0) or None),
        model_init=ModelInitConfig(sequential_move_factor=tr.sequential_move_factor,
                                   meta_device_init=config.model.meta_device_init),
        pipeline_config=pipeline,
        activation_checkpoint_config=activation_checkpoint,
        lora_config=lora.to_dict() if lora is not None else None,
        mixed_precision_config=(mixed_precision_config(config.precision, config.exp_manager.checkpoint_callback_params)
                                if ds.zero1 else None),
        compile_config=_compile(tr.compile),
        fsdp_config=(ds.fsdp if isinstance(ds.fsdp, dict) else {}) if ds.fsdp else None,
        model_transforms=model_transforms(config.precision, tr) or {},
        reduce_dtype=str(reduce).removeprefix("torch."),
        param_dtype="bfloat16" if config.precision.type in BF16_PARAM_TYPES else None,
        autocast_dtype="bfloat16" if config.precision.type in AUTOCAST_TYPES else None,
        derived=derived,
    )
