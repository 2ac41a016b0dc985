"""Build what one rank trains with, from the resolved config and its RunConfig, through the NxD facade."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

import nxd
from nxd.run_config import Derived, RunConfig
from nxd_training.config.plan import qlora_mode
from nxd_training.config.schema import DataConfig, OptimConfig, TrainingConfig
from nxd_training.lora_export import base_module
from nxd_training.optimizers import OPTIMIZERS
from nxd_training.schedules import make_lr_fn, make_scheduler


def param_groups(model: torch.nn.Module, decay_norms_and_biases: bool) -> list[dict]:
    """Weight decay on matrices only; norms and biases too with ``decay_norms_and_biases``
    (``model.do_layer_norm_weight_decay``)."""
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        is_norm_or_bias = param.dim() < 2 or name.endswith(".bias")
        (no_decay if is_norm_or_bias and not decay_norms_and_biases else decay).append(param)
    groups = [{"params": decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return groups


def build_optimizer(optim: OptimConfig, groups: list[dict], run: RunConfig,
                    context: nxd.ParallelContext | None = None) -> Any:
    """``model.optim``'s optimizer over the parameter ``groups``, wrapped by the run's data-parallel strategy."""
    cls, keys = OPTIMIZERS[optim.name.lower()]
    values = {"lr": optim.lr, "weight_decay": optim.weight_decay, "betas": tuple(optim.betas), "eps": optim.eps,
              "momentum": optim.momentum}
    return nxd.initialize_parallel_optimizer(run, cls, groups, context=context,
                                             **{k: values[k] for k in keys})


def build_scheduler(optim: OptimConfig, max_steps: int, optimizer: Any) -> torch.optim.lr_scheduler.LambdaLR:
    """``model.optim.sched`` over ``sched.max_steps``, else the run's ``max_steps`` (``trainer.max_steps``; -1: none)."""
    sched = optim.sched
    total = sched.max_steps or (max_steps if max_steps > 0 else None)
    lr_fn = make_lr_fn(sched.name, optim.lr, total, sched.warmup_steps, sched.min_lr, sched.constant_steps)
    return make_scheduler(optimizer, lr_fn, optim.lr)


def model_builder(config: TrainingConfig, spec: Any, context: nxd.ParallelContext) -> Callable[..., Any]:
    """The ``model_fn`` a rank gives ``initialize_parallel_model``: the model spec's build with the
    run's context. QLoRA (``peft.quantize_base``) quantises the base when the LoRA transform runs, so
    there the Hugging Face weights (``model.pretrained_checkpoint``) load into the plain model first,
    on every start, resumes included; on the meta device (the dry run before launch) only names and
    shapes are checked against the files' headers."""
    build_fn = nxd.parallel.bind_context(spec.build, context)
    if qlora_mode(config) is None:
        return build_fn
    folder = config.model.pretrained_checkpoint

    def build_and_load(*args: Any, **kwargs: Any) -> torch.nn.Module:
        from nxd_modeling.hf_interop import headers_only

        model = build_fn(*args, **kwargs)
        on_meta = any(p.is_meta for p in model.parameters())
        with headers_only() if on_meta else contextlib.nullcontext():
            spec.load_hf(model, folder)
        return model

    return build_and_load


def loads_pretrained_late(config: TrainingConfig) -> bool:
    """``model.pretrained_checkpoint`` loads into the built model (under its adapters), not into the
    plain model before the transforms (QLoRA: :func:`model_builder`)."""
    return bool(config.model.pretrained_checkpoint) and qlora_mode(config) is None


def load_pretrained(spec: Any, model: torch.nn.Module, lora: bool, folder: str) -> None:
    """``model.pretrained_checkpoint``: the Hugging Face folder's weights into the base model (under
    the LoRA adapters, if any). Under ``nxd_modeling.hf_interop.headers_only()`` (the dry run
    before launch) only names and shapes are checked against the files' headers."""
    spec.load_hf(base_module(model) if lora else model, folder)


def build_data(data: DataConfig, seed: int, derived: Derived, context: nxd.ParallelContext) -> Any:
    """The run's data module for this rank's data-parallel coordinates in ``context`` (a factory
    naming a ``context`` parameter receives the whole context), given the data section resolution
    recorded (the one its ``validate`` checked)."""
    factory = nxd.get_data_module(derived.data_module)
    return nxd.parallel.call_with_context(
        factory, dict(derived.data), context=context,
        seq_length=derived.seq_length, micro_batch_size=data.micro_batch_size, global_batch_size=data.global_batch_size,
        dp_rank=context.dp.rank, dp_size=context.dp.size, seed=seed,
    )
