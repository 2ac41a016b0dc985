"""NxD's model, optimizer and checkpoint entry points, dispatched to plugins through hooks."""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import Any

import torch

from nxd.config import check_config
from nxd.errors import ComponentNotFound, ConfigError
from nxd.lookup import get_component
from nxd.parallel import ParallelContext, call_with_context, resolve_context
from nxd.plugins import state
from nxd.transforms import applicable_transforms, apply_model_transforms, data_parallel_strategy


class CheckpointPhase(str, Enum):
    """The ``phase`` of ``nxd_checkpoint_extras``."""

    SAVED = "saved"
    LOADED = "loaded"


CHECKPOINT_PHASES: tuple[CheckpointPhase, ...] = tuple(CheckpointPhase)


def initialize_parallel_model(nxd_config: dict, model_fn: Callable[..., torch.nn.Module], include_buffers: bool = False,
                              *model_args: Any, **model_kwargs: Any):
    """Build ``model_fn(*model_args, **model_kwargs)`` with every optimisation in ``nxd_config``
    applied, and return a model usable as a regular ``nn.Module`` (NxD's ``NxDModel``).

    NxD's signature: ``include_buffers`` (third, positional) says whether meta-device init
    (``model_init_config.meta_device_init``) also creates buffers on the meta device. It has no room
    for the parallel context, so the current one is handed to the hooks (``context=``)."""
    config = check_config(nxd_config)
    if not callable(model_fn):
        raise ConfigError(f"model_fn must be a callable that returns an nn.Module, got {model_fn!r}")
    if not isinstance(include_buffers, bool):
        raise ConfigError(
            f"initialize_parallel_model's third argument is include_buffers (True/False), got {include_buffers!r}; "
            "NxD's signature is initialize_parallel_model(nxd_config, model_fn, include_buffers, *model_args, "
            "**model_kwargs): pass model_fn's arguments after include_buffers"
        )
    context = resolve_context()  # NxD's signature has no room for it: the current one
    model = state().pm.hook.nxd_build_model(
        nxd_config=config, model_fn=model_fn, model_args=model_args, model_kwargs=model_kwargs,
        include_buffers=include_buffers, context=context,
    )
    if model is None:
        raise ComponentNotFound("initialize_parallel_model needs a parallel runtime plugin: pip install nxd-core-parallel")
    return apply_model_transforms(model, context, config)


def initialize_parallel_optimizer(nxd_config: dict, optimizer_class: type, parameters: Any, *,
                                  context: ParallelContext | None = None, **defaults: Any):
    """Create ``optimizer_class(parameters, **defaults)`` wrapped so ``step()`` does the
    data-parallel gradient sync and clipping of ``nxd_config``: the optimizer side of the config's
    data-parallel strategy (a model transform: ``ddp``, ``zero1``, ...). The applicable transforms'
    ``after_optimizer_step`` callbacks run after each of its steps. The strategy and the callbacks
    receive ``context`` (the current parallel context when left out, as NxD's callers do)."""
    config = check_config(nxd_config)
    if not (isinstance(optimizer_class, type) and issubclass(optimizer_class, torch.optim.Optimizer)):
        raise ConfigError(f"optimizer_class must be a torch.optim.Optimizer subclass, got {optimizer_class!r}")
    context = resolve_context(context)
    strategy = data_parallel_strategy(context, config)
    optimizer = strategy.make_optimizer(config, optimizer_class, parameters, context=context, **defaults)
    for transform in applicable_transforms(context, config):
        make_callback = getattr(transform, "after_optimizer_step", None)
        callback = make_callback(optimizer, context, config) if make_callback is not None else None
        if callback is not None:
            innermost_optimizer(optimizer).register_step_post_hook(lambda *_, run=callback: run())
    return optimizer


def innermost_optimizer(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """Follow ``.optimizer`` through wrappers (NxDOptimizer -> torch optimizer) to the last torch
    optimizer: its step runs once per training step, after the wrapper's sync and clipping. Stops at
    a wrapper whose ``.optimizer`` is itself (NeuronZero1Optimizer answers NxD scripts'
    ``nxd_optimizer.optimizer`` with itself: following it forever spun every rank)."""
    seen = {id(optimizer)}
    inner = optimizer
    while isinstance(nxt := getattr(inner, "optimizer", None), torch.optim.Optimizer) and id(nxt) not in seen:
        seen.add(id(nxt))
        inner = nxt
    return inner


def _checkpointer() -> Any:
    return get_component("checkpointer", "default", need="saving and loading checkpoints")


def save_checkpoint(
    path: str,
    tag: str = "",
    model: Any = None,
    optimizer: Any = None,
    scheduler: Any = None,
    user_content: Any = None,
    num_workers: int = 8,
    use_xser: bool = False,
    num_kept_ckpts: int | None = None,
    async_save: bool = False,
    zero1_optimizer: bool = False,
    context: ParallelContext | None = None,
    **options: Any,
) -> None:
    """Save a checkpoint under ``path/tag`` (NxD's signature; see nxd-ckpt for the layout).
    ``num_kept_ckpts`` None or -1 keeps every checkpoint (as NxD). The checkpointer receives
    ``context`` (the current parallel context when left out) when its ``save`` names a ``context``
    parameter."""
    if num_kept_ckpts == -1:
        num_kept_ckpts = None
    call_with_context(
        _checkpointer().save, path, context=resolve_context(context), tag=tag, model=model, optimizer=optimizer, scheduler=scheduler, user_content=user_content,
        num_workers=num_workers, use_xser=use_xser, num_kept_ckpts=num_kept_ckpts, async_save=async_save,
        zero1_optimizer=zero1_optimizer, **options,
    )


def load_checkpoint(
    path: str,
    tag: str | None = None,
    model: Any = None,
    optimizer: Any = None,
    scheduler: Any = None,
    num_workers: int = 8,
    strict: bool = True,
    context: ParallelContext | None = None,
    **options: Any,
) -> Any:
    """Load the checkpoint ``path/tag`` (``tag=None``: the newest complete one) for ``context``
    (the current parallel context when left out); returns the saved ``user_content``."""
    return call_with_context(
        _checkpointer().load, path, context=resolve_context(context), tag=tag, model=model, optimizer=optimizer, scheduler=scheduler,
        num_workers=num_workers, strict=strict, **options,
    )


def checkpoint_extras(model: Any, path: str, tag: str, phase: str, context: ParallelContext | None = None) -> None:
    """Run the ``nxd_checkpoint_extras`` hook; checkpointers call it after a committed save
    (``phase="saved"``) and after a load (``phase="loaded"``) so plugins such as LoRA can write or
    read their own export of ``model`` under ``path/tag``. ``context``: the parallel context the
    checkpointer worked with (the current one when left out, for checkpointers written before it)."""
    try:
        phase = CheckpointPhase(phase)
    except ValueError:
        raise ValueError(f"checkpoint_extras phase must be one of {', '.join(p.value for p in CheckpointPhase)}, "
                         f"got {phase!r}") from None
    if model is None:
        return
    context = resolve_context(context)
    # not optional (a plugin's export would be missing without a word), but named when it fails
    state().call_each("nxd_checkpoint_extras", optional=False, model=model, path=str(path), tag=str(tag), phase=phase,
                      context=context)


def plan_run(config: Any, device_memory_gib: float | None = None) -> str | None:
    """The ``nxd_plan_run`` hook: an installed planner's one-line summary of a resolved training
    config (``None`` without one); raises :class:`ConfigError` when the plan proves it cannot fit."""
    # a planner that crashes is named and skipped: planning never blocks a run (a refusal is a ConfigError)
    return state().call_first("nxd_plan_run", optional=True, config=config, device_memory_gib=device_memory_gib)


def has_checkpoint(path: str, context: ParallelContext | None = None) -> bool:
    """Whether ``path`` holds at least one complete checkpoint (as ``context`` reads it, the current
    parallel context when left out)."""
    return bool(call_with_context(_checkpointer().has_checkpoint, path, context=resolve_context(context)))


def finalize_checkpoint() -> None:
    """Wait for in-flight asynchronous saves and raise any error they hit."""
    _checkpointer().finalize()
