"""Building the user's model: optional meta-device init with ``param_init_fn``, then materialising
and moving it to the device a few ranks at a time (NxD's ``sequential_move_factor``) so a host
does not hold every rank's full copy in memory at once."""

from __future__ import annotations

import contextlib
import inspect
import math
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from nxd.parallel import ParallelContext
from nxd.run_config import RunConfig
from nxd_core_parallel.backends import get_device
from nxd_core_parallel.dtensor import shard_like


def run_in_waves(work: Callable[[], None], factor: int) -> None:
    """Run ``work`` on at most ``factor`` local ranks at a time; every rank joins every wave's barrier."""
    up = dist.is_initialized()
    local_rank = int(os.environ.get("LOCAL_RANK", dist.get_rank() if up else 0))
    local_size = int(os.environ.get("LOCAL_WORLD_SIZE", dist.get_world_size() if up else 1))
    waves = math.ceil(local_size / factor)
    for wave in range(waves):
        if local_rank // factor == wave:
            work()
        if waves > 1 and dist.is_initialized():
            dist.barrier()


def _keep_param_attributes(module: nn.Module, convert: Callable[[nn.Module], Any]) -> None:
    # Module._apply may replace Parameter objects (e.g. leaving the meta device), dropping the
    # sharding attributes (tensor_model_parallel, partition_dim, ...) that checkpoints rely on.
    saved = {name: dict(p.__dict__) for name, p in module.named_parameters(recurse=False)}
    convert(module)
    for name, p in module.named_parameters(recurse=False):
        for key, value in saved.get(name, {}).items():
            if not hasattr(p, key):
                setattr(p, key, value)


def _is_meta(t: torch.Tensor) -> bool:
    return (t.to_local() if isinstance(t, DTensor) else t).is_meta


@contextlib.contextmanager
def _keeping_tied_parameters() -> Iterator[None]:
    # leaving the meta device makes new Parameter objects unless they are swapped in place: a
    # weight shared by two modules (tied embeddings) would come apart and be initialised twice
    previous = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        yield
    finally:
        torch.__future__.set_swap_module_params_on_conversion(previous)


@contextlib.contextmanager
def _whole_parameters(module: nn.Module, device: torch.device) -> Iterator[None]:
    """Within: ``module``'s sharded (DTensor) parameters are replaced by whole plain tensors of their
    global shape; on exit each shard takes its piece of what was written there, and the DTensors
    return. An initialiser therefore sees, and draws random numbers for, the same whole tensors as
    in an unsharded build: every rank's shard is a piece of the same initial weights."""
    sharded = {name: p for name, p in module._parameters.items() if isinstance(p, DTensor)}
    for name, p in sharded.items():
        whole = nn.Parameter(torch.empty(p.shape, dtype=p.dtype, device=device), requires_grad=p.requires_grad)
        whole.__dict__.update(p.__dict__)
        module._parameters[name] = whole
    try:
        yield
    finally:
        for name, p in sharded.items():
            whole = module._parameters[name]  # the initialiser may have assigned a new Parameter
            with torch.no_grad():
                p.to_local().copy_(shard_like(whole.detach(), p).to_local())
            module._parameters[name] = p


def materialize(model: nn.Module, device: torch.device, param_init_fn: Callable[[nn.Module], Any] | None) -> None:
    """Allocate ``model``'s meta tensors on ``device`` module by module, then ``param_init_fn(module)``.

    Parameters already sharded by ``fully_shard`` (DTensors over meta shards) allocate only this
    rank's shard; the module's initialiser runs on whole temporary tensors and each rank keeps its
    piece (:func:`_whole_parameters`), so the result is the unsharded build's, one module's whole
    tensors at a time. Modules are visited in ``model.modules()`` order either way: the global RNG
    is drawn in the same order as by the unsharded build."""
    pending = {id(t) for t in [*model.parameters(), *model.buffers()] if _is_meta(t)}
    for module in model.modules():
        local = [*module.parameters(recurse=False), *module.buffers(recurse=False)]
        if not any(id(t) in pending for t in local):
            continue  # nothing of its own on the meta device (a tied weight is initialised once)
        pending.difference_update(id(t) for t in local)
        # to_empty empties every tensor of the module: a buffer made for real beside a meta parameter
        # (include_buffers=False; Gemma 3's embed_scale beside its embedding weight) keeps its value
        real = {name: b for name, b in module._buffers.items() if b is not None and not _is_meta(b)}
        with _keeping_tied_parameters():
            _keep_param_attributes(module, lambda m: m.to_empty(device=device, recurse=False))
        for name, buffer in real.items():
            module._buffers[name] = buffer.to(device)
        if param_init_fn is not None:
            with torch.no_grad(), _whole_parameters(module, device):
                if _takes_device(param_init_fn):
                    param_init_fn(module, device)  # NxD's param_init_fn(module, device)
                else:
                    param_init_fn(module)


def reset_parameters(module: nn.Module) -> None:
    """A ``param_init_fn`` for models whose every module initialises its own tensors in
    ``reset_parameters()`` (nxd's layers and families do): each module re-runs its initialisation,
    drawing the global RNG as its constructor did, so the result is the build without meta."""
    if hasattr(module, "reset_parameters"):
        module.reset_parameters()


def _takes_device(fn: Callable[..., Any]) -> bool:
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return False
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return True
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 2


@contextlib.contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Create parameters on the meta device and leave buffers where they are made (NxD's meta
    init with ``include_buffers=False``: buffers such as RoPE tables keep their computed values)."""
    register = nn.Module.register_parameter

    def on_meta(module: nn.Module, name: str, param: Any) -> None:
        register(module, name, param)
        if param is not None and not param.is_meta:
            meta = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
            meta.__dict__.update(param.__dict__)
            module._parameters[name] = meta

    nn.Module.register_parameter = on_meta  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.register_parameter = register  # type: ignore[method-assign]


def move_to_device(model: nn.Module, device: torch.device) -> None:
    for module in model.modules():
        _keep_param_attributes(module, lambda m: m._apply(lambda t: t.to(device), recurse=False))


#: the attribute a model left on the meta device for a later transform carries (:class:`DeferredInit`)
_DEFERRED = "_nxd_deferred_init"


@dataclass(frozen=True)
class DeferredInit:
    """How to materialise a model the build left on the meta device (``meta_device_init`` with a
    transform that shards first: ``nxd.transforms.meta_materialiser``)."""

    device: torch.device
    param_init_fn: Callable[..., Any] | None
    sequential_move_factor: int


def deferred_init(model: nn.Module) -> DeferredInit | None:
    """The pending initialisation of a model built on the meta device and not materialised yet."""
    return getattr(model, _DEFERRED, None)


def materialize_deferred(model: nn.Module) -> None:
    """Materialise ``model`` (left on the meta device by :func:`build_model`, possibly sharded by
    now) as the build would have, a few local ranks at a time; a no-op for a materialised model."""
    pending = deferred_init(model)
    if pending is None:
        return
    if pending.device.type == "meta":  # a planner's fake world: shapes only, nothing to allocate
        delattr(model, _DEFERRED)
        return
    run_in_waves(lambda: materialize(model, pending.device, pending.param_init_fn), pending.sequential_move_factor)
    delattr(model, _DEFERRED)
    _check_materialised(model)


def _check_materialised(model: nn.Module) -> None:
    leftover = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if _is_meta(t)]
    if leftover:
        raise RuntimeError(f"tensors still on the meta device after materialisation: {leftover[:5]}")


def build_model(nxd_config: Mapping[str, Any] | None, model_fn: Callable[..., nn.Module], args: tuple, kwargs: dict,
                include_buffers: bool = False, device: torch.device | None = None,
                context: ParallelContext | None = None) -> nn.Module:
    """``model_fn(*args, **kwargs)`` placed on ``device`` (the parallel context's; the backend's
    device when not given), per ``nxd_config.model_init``.

    With ``meta_device_init`` and a transform that shards a meta-device model itself (FSDP:
    ``nxd.transforms.meta_materialiser``), the model stays on the meta device: that transform calls
    :func:`materialize_deferred` once it holds only this rank's shards."""
    nxd_config = RunConfig.of(nxd_config)
    init = nxd_config.model_init
    device = device if device is not None else get_device()
    if init.meta_device_init:
        with torch.device("meta") if include_buffers else parameters_on_meta():
            model = model_fn(*args, **kwargs)
        if not isinstance(model, nn.Module):
            raise TypeError(f"model_fn must return an nn.Module, got {type(model).__name__}")
        # no param_init_fn (the run config's default): each module's own reset_parameters
        setattr(model, _DEFERRED, DeferredInit(device, init.param_init_fn or reset_parameters,
                                               init.sequential_move_factor))
        from nxd.transforms import meta_materialiser

        if meta_materialiser(context, nxd_config) is None:
            materialize_deferred(model)
    else:
        model = model_fn(*args, **kwargs)
        run_in_waves(lambda: move_to_device(model, device), init.sequential_move_factor)
    if not isinstance(model, nn.Module):
        raise TypeError(f"model_fn must return an nn.Module, got {type(model).__name__}")
    return model  # parallelism (TP plan, pad_model, ...) is the transforms' (nxd.transforms)
