"""Apply ``torch.distributed.fsdp.fully_shard`` to an nxd model.

Each transformer block (the classes activation checkpointing uses: ``nxd_transformer_layer_classes``
or Hugging Face's ``_no_split_modules``) becomes one FSDP unit, and the root holds the rest
(embeddings, final norm, head). nxd's tensor-parallel layers keep plain (TP-local) parameters, which
``fully_shard`` shards along dim 0 over the data-parallel mesh; the attributes nxd's layers set on
them (``tensor_model_parallel``, ``partition_dim``, ``sequence_parallel_enabled``, ...) are copied to
the sharded parameters, so grad sync, clipping and checkpoints still see them.

The root's ``state_dict()`` holds full (DP-gathered, still TP-local) tensors and its
``load_state_dict`` takes them, so nxd-ckpt reads and writes the same layout as plain data
parallelism; :func:`sharded_state_dict` switches to the DTensor shards (DCP). Each sharded parameter
names the group its rows are cut over (``nxd_core_parallel.dtensor.SHARD_GROUP``), so code that
reads or writes whole parameters of the live model (HF import and export, LoRA adapters) gathers
them with ``dtensor.whole`` and writes them with ``dtensor.copy_whole_``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.distributed.tensor import DTensor

from nxd_core_parallel.dtensor import SHARD_GROUP, full_rows, shard_like
from nxd_core_parallel.grads import is_expert_parallel
from nxd_core_parallel.module_walk import outermost_instances
from nxd_fsdp.config import FsdpConfig
from nxd_fsdp.mesh import shard_group

_FULL_STATE = "_nxd_fsdp_full_state_dict"
_MESH = "_nxd_fsdp_mesh"


def block_classes(model: nn.Module) -> tuple[type, ...]:
    """The model's transformer block classes (each becomes an FSDP unit); none: the root only."""
    from nxd_core_parallel.activation_checkpoint import transformer_layer_classes

    try:
        return transformer_layer_classes(model)
    except ValueError:  # the model declares no blocks: one FSDP unit (the root) is still exact
        return ()


def _outermost(model: nn.Module, classes: tuple[type, ...]) -> list[nn.Module]:
    # below the root (the root is its own unit)
    return [block for child in model.children() for block in outermost_instances(child, classes)]


def fully_shard_kwargs(config: FsdpConfig, mesh: DeviceMesh) -> dict[str, Any]:
    """``fully_shard``'s arguments for ``config`` on ``mesh``."""
    return {
        "mesh": mesh,
        "reshard_after_forward": config.reshard_after_forward,
        "mp_policy": MixedPrecisionPolicy(param_dtype=config.param_torch_dtype, reduce_dtype=config.reduce_torch_dtype),
        "offload_policy": CPUOffloadPolicy() if config.cpu_offload else OffloadPolicy(),
    }


def _direct_owners(model: nn.Module, blocks: list[nn.Module]) -> list[nn.Module]:
    """Modules outside ``blocks`` (and not ``model``) that own parameters themselves."""
    inside = {id(m) for b in blocks for m in b.modules()}
    return [m for m in model.modules() if m is not model and id(m) not in inside
            and any(True for _ in m.parameters(recurse=False))]


def check_pipeline_stage(stage: nn.Module) -> None:
    """Refuse a pipeline stage FSDP cannot shard exactly (see :func:`shard_model`'s ``pipeline_stage``)."""
    seen: dict[int, str] = {}
    for name, p in stage.named_parameters(remove_duplicate=False):
        if id(p) in seen:
            raise ValueError(f"FSDP with pipeline parallelism: {name} and {seen[id(p)]} are one (tied) parameter; "
                             "nxd-pipeline all-reduces tied weights' gradients across stages, which FSDP's sharded "
                             "gradients do not take; untie them (tie_word_embeddings=false) or use ZeRO-1")
        seen[id(p)] = name
    if any(True for _ in stage.parameters(recurse=False)):
        raise ValueError("FSDP with pipeline parallelism: the stage module owns parameters directly, which only its "
                         "forward (never called by the schedule) would gather; move them into a submodule")


def expert_units(model: nn.Module) -> list[nn.Module]:
    """Modules owning expert-parallel parameters (nxd-moe's ``ExpertMLPs`` at EP > 1): each is an FSDP
    unit of its own over the expert-data-parallel mesh."""
    return [m for m in model.modules()
            if any(is_expert_parallel(p) for p in m.parameters(recurse=False))]


@dataclass(frozen=True)
class ExpertSharding:
    """Where expert-parallel parameters shard (``mesh``: the expert-data-parallel ranks) and what their
    reduce-scatter's sum is divided by (``divide_factor``: DP x CP, as nxd-core-parallel's
    ``expert_gradient_divisor``; FSDP's default would be the expert-DP size, EP times too few)."""

    mesh: DeviceMesh
    divide_factor: int


def shard_model(model: nn.Module, mesh: DeviceMesh, config: FsdpConfig, *, pipeline_stage: bool = False,
                experts: ExpertSharding | None = None) -> nn.Module:
    """``fully_shard`` each block of ``model`` and then ``model`` itself, in place; returns ``model``.

    ``pipeline_stage``: ``model`` is a pipeline stage, whose schedule calls its parts (embedding,
    blocks, head) directly and never its own ``forward``: every other module owning parameters
    becomes a unit too, so each part gathers its own parameters when it runs. ``experts``: modules
    owning expert-parallel parameters become units first, over ``experts.mesh``; without it a
    model holding such parameters is refused (they differ per EP rank: the DP mesh cannot shard them)."""
    attributes = {name: dict(p.__dict__) for name, p in model.named_parameters(remove_duplicate=False) if p.__dict__}
    kwargs = fully_shard_kwargs(config, mesh)
    blocks = _outermost(model, block_classes(model))
    if pipeline_stage:
        check_pipeline_stage(model)
        blocks += _direct_owners(model, blocks)
    expert_modules = expert_units(model)
    if expert_modules and experts is None:
        raise ValueError("the model has expert-parallel parameters but no expert mesh was given (ExpertSharding)")
    for unit in expert_modules:
        # inner units first: the block around them then leaves their parameters to them
        fully_shard(unit, **{**kwargs, "mesh": experts.mesh})
        unit.set_gradient_divide_factor(float(experts.divide_factor))
        if experts.mesh.device_type == "cpu" and experts.mesh.size() > 1:
            # a custom factor is NCCL's PREMUL_SUM, which gloo lacks: sum, then divide. (Not on one
            # rank: there torch 2.13's FSDP divides in its copy and again after it when forced.)
            unit.set_force_sum_reduction_for_comms(True)
    for block in blocks:
        fully_shard(block, **kwargs)
    fully_shard(model, **kwargs)
    for name, p in model.named_parameters(remove_duplicate=False):
        for key, value in attributes.get(name, {}).items():
            if key not in p.__dict__:
                setattr(p, key, value)
    # the group each parameter's rows are cut over, for code that reads or writes whole parameters
    # (nxd_core_parallel.dtensor.whole: HF and LoRA export of the live model)
    for unit in expert_modules:
        for p in unit.parameters():
            setattr(p, SHARD_GROUP, shard_group(experts.mesh))
    for p in model.parameters():
        if isinstance(p, DTensor) and not hasattr(p, SHARD_GROUP):
            setattr(p, SHARD_GROUP, shard_group(mesh))
    setattr(model, _FULL_STATE, True)
    setattr(model, _MESH, mesh)
    model.register_state_dict_post_hook(_gather_full_state)
    model.register_load_state_dict_pre_hook(_shard_full_state)
    return model


def _gather_full_state(module: nn.Module, state_dict: dict, prefix: str, local_metadata: Any) -> None:
    # collective: every rank of the mesh asks for the state dict (nxd-ckpt's save does)
    if not getattr(module, _FULL_STATE, False):
        return
    # (experts at EP > 1 arrive whole: nxd-moe gathered them over their own groups)
    group = shard_group(getattr(module, _MESH))
    for key, value in state_dict.items():
        if isinstance(value, DTensor):
            state_dict[key] = full_rows(value, group)


def _shard_full_state(module: nn.Module, state_dict: dict, prefix: str, *args: Any) -> None:
    if not getattr(module, _FULL_STATE, False):
        return
    for name, param in module.named_parameters(remove_duplicate=False):
        key = prefix + name
        value = state_dict.get(key)
        # every rank holds the full tensor: each cuts its own shard, nothing is sent. A value of
        # another shape is cut by its module first (nxd-moe's experts keep their EP rank's experts)
        if isinstance(value, torch.Tensor) and value.shape == param.shape:
            state_dict[key] = shard_like(value, param)


@contextlib.contextmanager
def sharded_state_dict(module: nn.Module) -> Iterator[nn.Module]:
    """Within: ``module.state_dict()`` holds the DTensor shards and ``load_state_dict`` takes
    them (what torch.distributed.checkpoint reads and writes)."""
    previous = getattr(module, _FULL_STATE, False)
    setattr(module, _FULL_STATE, False)
    try:
        yield module
    finally:
        setattr(module, _FULL_STATE, previous)


def mesh_of(module: nn.Module) -> DeviceMesh:
    """The mesh :func:`shard_model` sharded ``module`` over."""
    return getattr(module, _MESH)
