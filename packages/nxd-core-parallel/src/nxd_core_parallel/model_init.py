"""Building the user's model: optional meta-device init with ``param_init_fn``, then materialising
and moving it to the device a few ranks at a time (NxD's ``sequential_move_factor``) so a host
does not hold every rank's full copy in memory at once."""

from __future__ import annotations

import contextlib
import inspect
import math
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from nxd.parallel import ParallelContext
from nxd.resolved import NxdConfig
from nxd_core_parallel.backends import get_device


def _local_rank_and_size() -> tuple[int, int]:
    world = dist.get_world_size() if dist.is_initialized() else 1
    rank = dist.get_rank() if dist.is_initialized() else 0
    return int(os.environ.get("LOCAL_RANK", rank)), int(os.environ.get("LOCAL_WORLD_SIZE", world))


def run_in_waves(work: Callable[[], None], factor: int) -> None:
    """Run ``work`` on at most ``factor`` local ranks at a time; every rank joins every wave's barrier."""
    local_rank, local_size = _local_rank_and_size()
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


def materialize(model: nn.Module, device: torch.device, param_init_fn: Callable[[nn.Module], Any] | None) -> None:
    """Allocate ``model``'s meta tensors on ``device`` module by module, then ``param_init_fn(module)``."""
    for module in model.modules():
        local = list(module.parameters(recurse=False)) + list(module.buffers(recurse=False))
        if not any(t.is_meta for t in local):
            continue
        _keep_param_attributes(module, lambda m: m.to_empty(device=device, recurse=False))
        if param_init_fn is not None:
            with torch.no_grad():
                if _takes_device(param_init_fn):
                    param_init_fn(module, device)  # NxD's param_init_fn(module, device)
                else:
                    param_init_fn(module)


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


def build_model(nxd_config: Mapping[str, Any] | None, model_fn: Callable[..., nn.Module], args: tuple, kwargs: dict,
                include_buffers: bool = False, device: torch.device | None = None,
                context: ParallelContext | None = None) -> nn.Module:
    """``model_fn(*args, **kwargs)`` placed on ``device`` (the parallel context's; the backend's
    device when not given), per ``nxd_config.model_init``."""
    nxd_config = NxdConfig.of(nxd_config)
    init = nxd_config.model_init
    device = device if device is not None else get_device()
    if init.meta_device_init:
        with torch.device("meta") if include_buffers else parameters_on_meta():
            model = model_fn(*args, **kwargs)
        run_in_waves(lambda: materialize(model, device, init.param_init_fn), init.sequential_move_factor)
        leftover = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
        if leftover:
            raise RuntimeError(f"tensors still on the meta device after materialisation: {leftover[:5]}")
    else:
        model = model_fn(*args, **kwargs)
        run_in_waves(lambda: move_to_device(model, device), init.sequential_move_factor)
    if not isinstance(model, nn.Module):
        raise TypeError(f"model_fn must return an nn.Module, got {type(model).__name__}")
    if nxd_config.pad_model:
        from nxd_core_parallel.parallel_layers.pad import pad_model_from_config

        model = pad_model_from_config(model, context)  # structural: before adapters, checkpointing and the pipeline cut
    return model
