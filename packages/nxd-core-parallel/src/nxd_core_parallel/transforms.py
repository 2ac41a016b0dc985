"""nxd-core-parallel's model transforms (:mod:`nxd.transforms`): activation checkpointing, compile
and the ``ddp`` data-parallel strategy (``NxDModel`` + ``NxDOptimizer``). The layout transforms are
registered by the packages that implement them (nxd-tensor-parallel, nxd-context-parallel)."""

from __future__ import annotations

from typing import Any

import torch

from nxd import ParallelContext
from nxd.run_config import RunConfig
from nxd.transforms import ModelTransform, When


def _checkpoint(model: torch.nn.Module, context: ParallelContext | None, config: RunConfig) -> torch.nn.Module:
    from nxd_core_parallel.activation_checkpoint import apply_activation_checkpointing, transformer_layer_classes

    setting = config.activation_checkpoint_config
    layers = setting in ("full", "op")  # every transformer layer; "op" keeps its matmul outputs
    apply_activation_checkpointing(model, transformer_layer_classes(model) if layers else setting,
                                   op_level=setting == "op")
    return model


def _compile(model: torch.nn.Module, context: ParallelContext | None, config: RunConfig) -> torch.nn.Module:
    # after checkpointing: each block compiles together with its recomputation
    from nxd_core_parallel.activation_checkpoint import transformer_layer_classes
    from nxd_core_parallel.compile import compile_blocks

    compile_blocks(model, transformer_layer_classes(model), config.compile_config)
    return model


def strategy_selected(name: str) -> When:
    """``applies`` of the data-parallel strategy ``name``: the config names it."""
    return When("data_parallel_strategy", equals=name)


def wrap_nxd_model(model: torch.nn.Module, context: ParallelContext | None, config: RunConfig) -> torch.nn.Module:
    """The model side of ``ddp`` and ``zero1``: NxD's ``NxDModel`` (the step contract; gradients
    are synced by the optimizer side, overlapped with backward)."""
    from nxd_core_parallel.trainer import NxDModel

    return model if isinstance(model, NxDModel) else NxDModel(model, config)


def ddp_optimizer(config: RunConfig, optimizer_class: type, parameters: Any, *, context: ParallelContext | None = None,
                  **defaults: Any) -> torch.optim.Optimizer:
    """The optimizer side of ``ddp`` (and the registered optimizer ``default``): NxD's
    ``NxDOptimizer`` around ``optimizer_class(parameters, **defaults)`` (DP gradient sync, clipping)."""
    from nxd_core_parallel.wrapped_optimizer import NxDOptimizer

    return NxDOptimizer(optimizer_class(parameters, **defaults), config, context=context)


TRANSFORMS = (
    ModelTransform("activation_checkpointing", "activation_checkpointing", _checkpoint, When("activation_checkpoint_config"),
                   description="full, selective (module classes) or op-level activation checkpointing"),
    ModelTransform("compile", "compile", _compile, When("compile_config"), description="torch.compile per transformer block"),
    ModelTransform("ddp", "data_parallel", wrap_nxd_model, strategy_selected("ddp"), make_optimizer=ddp_optimizer,
                   description="replicated parameters; bucketed gradient all-reduce overlapped with backward"),
)
