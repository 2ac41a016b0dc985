"""nxd plugin entry point for nxd-lora: the ``lora`` adapter and the ``lora`` model transform."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import nxd
from nxd.run_config import RunConfig
from nxd.trainer import CheckpointPhase
from nxd.transforms import ModelTransform, When

NXD_PLUGIN_API = (4, 4)  # plugin-API versions this plugin supports (inclusive range)


def lora_adapter(model: Any, adapter_config: Any, context: nxd.ParallelContext | None = None) -> Any:
    """The registered ``lora`` adapter: ``adapter(model, lora_config) -> LoRAModel`` for the
    model's parallel ``context`` (the current one when left out)."""
    from nxd_lora.checkpoint import check_lora_config, lora_model_from_config

    config = check_lora_config(adapter_config)
    return model if config is None else lora_model_from_config(model, config, context)


@nxd.hookimpl
def nxd_register_adapters(registry: Any) -> None:
    registry.add("lora", lora_adapter)


@nxd.hookimpl
def nxd_validate_config(nxd_config: RunConfig) -> None:
    if nxd_config.lora_config is None:
        return  # LoRA is off
    from nxd_lora.checkpoint import check_lora_config

    config = check_lora_config(nxd_config.lora_config)
    if config is not None and nxd_config.pipeline_parallel_size > 1:
        raise nxd.ConfigError("lora_config with pipeline_parallel_size > 1 is not supported by nxd-lora yet; use PP=1")
    if config is not None and config.quantize_base is not None:
        _check_qlora_layout(config.quantize_base, nxd_config)


def _check_qlora_layout(mode: str, nxd_config: RunConfig) -> None:
    """What QLoRA's NF4 base cannot be composed with, refused before any rank builds."""
    key = f"lora_config.quantize_base={mode!r}"
    if nxd_config.tensor_parallel_size > 1:
        raise nxd.ConfigError(f"{key} with tensor_parallel_size={nxd_config.tensor_parallel_size}: NF4 over TP shards "
                              "is not supported (each rank would quantise its shard with its own scales, so the base "
                              "would depend on the TP size); use tensor_parallel_size=1 with FSDP or DDP")
    if nxd_config.transform_options("fp8") is not None:
        raise nxd.ConfigError(f"{key} with the fp8 model transform: FP8 computes the base matmuls in float8 from a "
                              "plain weight, the NF4 base is 4-bit codes; use one of them")
    if nxd_config.model_init.meta_device_init:
        raise nxd.ConfigError(f"{key} with meta_device_init: the base is quantised from its weights when LoRA is "
                              "applied, before they would be initialised on the meta device; build on the CPU")


def _fsdp_shards(context: nxd.ParallelContext | None, nxd_config: RunConfig) -> int:
    """How many row shards FSDP cuts each parameter into (1 without FSDP; HSDP: DP / replicas)."""
    if context is None or nxd_config.data_parallel_strategy != "fsdp":
        return 1
    fsdp = nxd_config.fsdp_config if isinstance(nxd_config.fsdp_config, dict) else {}
    return context.dp.size // int(fsdp.get("replicate_degree", 1) or 1)


def _apply_lora(model: Any, context: nxd.ParallelContext | None, nxd_config: RunConfig) -> Any:
    model = lora_adapter(model, nxd_config.lora_config, context)
    if getattr(getattr(model, "lora_config", None), "quantize_base", None) is not None:
        from nxd_lora.quantize import check_nf4_shards

        check_nf4_shards(model, _fsdp_shards(context, nxd_config), "FSDP (data_parallel_strategy=fsdp)")
    return model


# applies when lora_config is given; lora_adapter leaves the model as it is when enable_lora is False
LORA_TRANSFORM = ModelTransform("lora", "adapter", _apply_lora, When("lora_config"),
                                description="LoRA adapters on the (parallel) linear layers of lora_config")


@nxd.hookimpl
def nxd_register_model_transforms(registry: Any) -> None:
    registry.add(LORA_TRANSFORM.name, LORA_TRANSFORM)


@nxd.hookimpl
def nxd_checkpoint_extras(model: Any, path: str, tag: str, phase: str) -> None:
    """Next to a committed ``nxd.save_checkpoint`` of a LoRA model, write the export its
    ``LoraConfig`` asks for under ``path/tag`` (``lora_adapter/`` and/or ``base_model/``); after
    ``nxd.load_checkpoint`` with ``load_lora_from_ckpt=True``, reload the adapter saved there."""
    from nxd_lora.checkpoint import ADAPTER_DIR, unwrap_lora

    try:
        lora = unwrap_lora(model)
    except TypeError:  # not a LoRA model: nothing to add
        return
    if "://" in path and not path.startswith("file://"):
        warnings.warn(f"nxd-lora: no LoRA export next to the checkpoint {path}/{tag}: only local paths are "
                      "supported; call nxd_lora.checkpoint.save_lora_checkpoint with a local folder", stacklevel=2)
        return
    local = path.removeprefix("file://")
    if phase is CheckpointPhase.SAVED:
        from nxd_lora.checkpoint import save_lora_checkpoint

        save_lora_checkpoint(lora, local, tag)
    elif phase is CheckpointPhase.LOADED and lora.lora_config.load_lora_from_ckpt:
        from nxd_lora.peft_format import CONFIG_NAME, load_adapter

        adapter_dir = Path(local) / tag / ADAPTER_DIR
        if (adapter_dir / CONFIG_NAME).is_file():
            load_adapter(lora, adapter_dir)
