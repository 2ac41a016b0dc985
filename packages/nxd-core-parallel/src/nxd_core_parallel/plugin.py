"""nxd plugin entry point for nxd-core-parallel: backends, parallel state, model build, the
``default`` optimizer wrapper and the model transforms of :mod:`nxd_core_parallel.transforms`
(activation checkpointing, compile, ddp)."""

from __future__ import annotations

from typing import Any

import nxd
from nxd.run_config import RunConfig

NXD_PLUGIN_API = (4, 4)  # plugin-API versions this plugin supports (inclusive range)


@nxd.hookimpl
def nxd_register_backends(registry: Any) -> None:
    from nxd_core_parallel.backends import BACKENDS

    for name, backend in BACKENDS.items():
        registry.add(name, backend)


@nxd.hookimpl
def nxd_register_optimizers(registry: Any) -> None:
    from nxd_core_parallel.transforms import ddp_optimizer

    registry.add("default", ddp_optimizer)  # the ddp strategy's optimizer side, also by name


@nxd.hookimpl
def nxd_initialize_parallel(nxd_config: RunConfig) -> Any:
    """Build (or keep, when the sizes match) the parallel context and return it."""
    from nxd_core_parallel.context import start_parallel_context

    return start_parallel_context(nxd_config.tensor_parallel_size, nxd_config.pipeline_parallel_size,
                                  nxd_config.context_parallel_size, nxd_config.expert_parallel_size)


@nxd.hookimpl
def nxd_build_model(nxd_config: RunConfig, model_fn: Any, model_args: tuple, model_kwargs: dict,
                    include_buffers: bool, context: nxd.ParallelContext | None) -> Any:
    from nxd_core_parallel.backends import get_device
    from nxd_core_parallel.model_init import build_model

    device = context.device if context is not None else get_device()
    return build_model(nxd_config, model_fn, model_args, model_kwargs, include_buffers=include_buffers, device=device,
                       context=context)


@nxd.hookimpl
def nxd_register_model_transforms(registry: Any) -> None:
    from nxd_core_parallel.transforms import TRANSFORMS

    for transform in TRANSFORMS:
        registry.add(transform.name, transform)
