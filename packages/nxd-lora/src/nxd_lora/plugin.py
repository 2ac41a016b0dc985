"""nxd plugin entry point for nxd-lora: the ``lora`` adapter and the ``adapter`` wrap phase."""

from __future__ import annotations

from typing import Any

import nxd

NXD_PLUGIN_API = (1, 1)  # plugin-API versions this plugin supports (inclusive range)


def lora_adapter(model: Any, adapter_config: Any) -> Any:
    """The registered ``lora`` adapter: ``adapter(model, lora_config) -> LoRAModel``."""
    from nxd_lora.checkpoint import check_lora_config, lora_model_from_config

    config = check_lora_config(adapter_config)
    return model if config is None else lora_model_from_config(model, config)


@nxd.hookimpl
def nxd_register_adapters(registry: Any) -> None:
    registry.add("lora", lora_adapter)


@nxd.hookimpl
def nxd_validate_config(nxd_config: dict) -> None:
    from nxd_lora.checkpoint import check_lora_config

    config = check_lora_config(nxd_config.get("lora_config"))
    if config is not None and nxd_config.get("pipeline_parallel_size", 1) > 1:
        raise nxd.ConfigError("lora_config with pipeline_parallel_size > 1 is not supported by nxd-lora yet; use PP=1")


@nxd.hookimpl
def nxd_wrap_model(nxd_config: dict, model: Any, phase: str) -> Any:
    if phase != "adapter":
        return None
    from nxd_lora.checkpoint import check_lora_config, lora_model_from_config

    config = check_lora_config(nxd_config.get("lora_config"))
    if config is None:
        return None
    return lora_model_from_config(model, config)
