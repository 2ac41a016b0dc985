"""nxd-core-parallel's model transforms (:mod:`nxd.transforms`): the tensor-parallel plan of a plain
model, context parallelism (ring attention), NxD's attention-head padding (``pad_model``), activation
checkpointing, compile and the ``ddp`` data-parallel strategy (``NxDModel`` + ``NxDOptimizer``)."""

from __future__ import annotations

from typing import Any

import torch

from nxd import ParallelContext
from nxd.run_config import RunConfig
from nxd.transforms import ALWAYS, ModelTransform, When
from nxd_core_parallel.context_parallel.transform import apply_context_parallel
from nxd_core_parallel.tensor_plan import apply_parallel_plan


def _pad(model: torch.nn.Module, context: ParallelContext | None, config: RunConfig) -> torch.nn.Module:
    # structural: after the TP layers exist, before adapters, checkpointing and the pipeline cut
    from nxd_core_parallel.parallel_layers.pad import pad_model_from_config

    return pad_model_from_config(model, context)


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
    # at any TP: a model carrying a plan (nxd's families built plain) gets its layers at TP=1 too
    ModelTransform("parallel_plan", "parallel_plan", apply_parallel_plan, ALWAYS,
                   description="a model's nxd_parallel_plan (a family's, or a plain model's): nn.Linear/nn.Embedding/QKVLinear "
                               "-> TP/SP layers with their shards"),
    ModelTransform("context_parallel", "context_parallel", apply_context_parallel, When("context_parallel_size", above=1),
                   description="ring attention over CP in the attention modules the plan names context_parallel; "
                               "the forward takes this CP rank's chunks of each sequence"),
    ModelTransform("pad_model", "pad_model", _pad, When("pad_model"),
                   description="NxD's pad_model: attention heads padded with zero heads to a multiple of the TP size"),
    ModelTransform("activation_checkpointing", "activation_checkpointing", _checkpoint, When("activation_checkpoint_config"),
                   description="full, selective (module classes) or op-level activation checkpointing"),
    ModelTransform("compile", "compile", _compile, When("compile_config"), description="torch.compile per transformer block"),
    ModelTransform("ddp", "data_parallel", wrap_nxd_model, strategy_selected("ddp"), make_optimizer=ddp_optimizer,
                   description="replicated parameters; bucketed gradient all-reduce overlapped with backward"),
)
