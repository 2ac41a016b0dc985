"""The ``fsdp`` data-parallel strategy: the model side (``fully_shard`` + :class:`FSDPModel`) and the
optimizer side (:class:`FSDPOptimizer`), both over the mesh of the parallel context's DP ranks."""

from __future__ import annotations

from typing import Any

import torch

from nxd import ConfigError, ParallelContext
from nxd.run_config import RunConfig
from nxd.transforms import ModelTransform
from nxd_core_parallel.grads import expert_gradient_divisor
from nxd_core_parallel.model_init import materialize_deferred
from nxd_core_parallel.transforms import strategy_selected
from nxd_fsdp.config import FsdpConfig, check_fsdp, resolve_fsdp_config
from nxd_fsdp.mesh import expert_mesh, fsdp_mesh
from nxd_fsdp.model import FSDPModel
from nxd_fsdp.optimizer import FSDPOptimizer
from nxd_fsdp.shard import ExpertSharding, shard_model

NAME = "fsdp"
#: the key of the resolved settings in the NxD config (``neuronx_distributed_config(fsdp_config=...)``)
CONFIG_KEY = "fsdp_config"


def fsdp_settings(nxd_config: dict) -> FsdpConfig:
    """The FSDP settings of ``nxd_config`` (defaults when it selects FSDP without any)."""
    value = RunConfig.of(nxd_config).fsdp_config
    return resolve_fsdp_config(True if value is None or value == {} else value)


def check_settings(fsdp: FsdpConfig, nxd_config: dict) -> None:
    """Refuse, before any rank starts, what the config alone shows cannot run (``nxd_validate_config``)."""
    nxd_config = RunConfig.of(nxd_config)
    check_fsdp(fsdp, data_parallel_size=None, expert_parallel_size=nxd_config.expert_parallel_size,
               context_parallel_size=nxd_config.context_parallel_size, zero1=nxd_config.optimizer.zero_one_enabled)


def check_context(fsdp: FsdpConfig, context: ParallelContext | None, nxd_config: dict) -> ParallelContext:
    """Everything :func:`check_settings` checks, plus what needs the ranks (DP size, device)."""
    if context is None:
        raise ConfigError("FSDP needs torch.distributed initialised (a parallel context) before the model is built")
    check_fsdp(fsdp, data_parallel_size=context.dp.size, expert_parallel_size=context.ep.size,
               context_parallel_size=context.cp.size,
               zero1=RunConfig.of(nxd_config).optimizer.zero_one_enabled,
               accelerator=context.device.type)
    return context


def materialises_meta(context: ParallelContext | None, nxd_config: dict) -> bool:
    """Whether a ``meta_device_init`` build is left on the meta device for :func:`shard` to cut first
    and then materialise only this rank's shards. Not with pipeline parallelism (the stage keeps
    some modules only, and the global RNG must be drawn for every module in order to give the
    unsharded build's weights), LoRA (its adapters initialise from their own shared generator) or
    ``pad_model`` (which rebuilds parameters): those materialise the whole model first, as before."""
    cfg = RunConfig.of(nxd_config)
    return (cfg.model_init.meta_device_init and context is not None and context.pp.size == 1
            and cfg.lora_config is None and not cfg.pad_model)


def shard(model: torch.nn.Module, context: ParallelContext | None, nxd_config: dict) -> FSDPModel:
    """The model side: ``fully_shard`` ``model`` over ``context``'s DP mesh and wrap it. A model the
    build left on the meta device (:func:`materialises_meta`) is materialised after sharding: each
    rank allocates its shards only, and they hold the unsharded build's initial weights."""
    fsdp = fsdp_settings(nxd_config)
    context = check_context(fsdp, context, nxd_config)
    if isinstance(model, FSDPModel):
        return model
    mesh = fsdp_mesh(context, fsdp.replicate_degree)
    experts = (ExpertSharding(expert_mesh(context), expert_gradient_divisor(context))
               if context.ep.size > 1 else None)
    if context.pp.size > 1:  # nxd-pipeline's model: shard this rank's stage, keep its schedule
        shard_model(model.local_module(), mesh, fsdp, pipeline_stage=True, experts=experts)
        return FSDPModel(model, nxd_config, mesh, fsdp)
    shard_model(model, mesh, fsdp, experts=experts)
    materialize_deferred(model)
    return FSDPModel(model, nxd_config, mesh, fsdp)


def make_optimizer(nxd_config: dict, optimizer_class: type[torch.optim.Optimizer], parameters: Any, *,
                   context: ParallelContext | None, **defaults: Any) -> FSDPOptimizer:
    """The optimizer side: ``optimizer_class`` over the sharded parameters, wrapped for clipping
    across shards and reshardable checkpoints."""
    fsdp = fsdp_settings(nxd_config)
    context = check_context(fsdp, context, nxd_config)
    mesh = fsdp_mesh(context, fsdp.replicate_degree)
    return FSDPOptimizer(optimizer_class(parameters, **defaults), nxd_config, context, mesh)


#: the registered data-parallel strategy (``neuronx_distributed_config(fsdp_config=...)`` or
#: ``data_parallel_strategy="fsdp"``; YAML ``distributed_strategy.fsdp``)
FSDP_TRANSFORM = ModelTransform(NAME, "data_parallel", shard, strategy_selected(NAME), make_optimizer=make_optimizer,
                                description="FSDP2: fully_shard over the data-parallel mesh (ZeRO-3/ZeRO-2, HSDP)",
                                materialises_meta=materialises_meta)
