"""nxd plugin entry point for nxd-fsdp: the ``fsdp`` data-parallel strategy (a model transform)."""

from __future__ import annotations

from typing import Any

import nxd

NXD_PLUGIN_API = (4, 4)  # plugin-API versions this plugin supports (inclusive range)


@nxd.hookimpl
def nxd_register_model_transforms(registry: Any) -> None:
    from nxd_fsdp.strategy import FSDP_TRANSFORM

    registry.add(FSDP_TRANSFORM.name, FSDP_TRANSFORM)


@nxd.hookimpl
def nxd_validate_config(nxd_config: dict) -> None:
    from nxd_fsdp.strategy import NAME, check_settings, fsdp_settings

    if nxd_config.data_parallel_strategy == NAME:
        check_settings(fsdp_settings(nxd_config), nxd_config)
