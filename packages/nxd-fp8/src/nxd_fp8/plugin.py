"""nxd plugin entry point for nxd-fp8: the ``fp8`` model transform and its config check."""

from __future__ import annotations

from typing import Any

import nxd
from nxd.run_config import RunConfig
from nxd_fp8.options import NAME

NXD_PLUGIN_API = (4, 4)  # plugin-API versions this plugin supports (inclusive range)


@nxd.hookimpl
def nxd_register_model_transforms(registry: Any) -> None:
    from nxd_fp8.transform import FP8_TRANSFORM

    registry.add(FP8_TRANSFORM.name, FP8_TRANSFORM)


@nxd.hookimpl
def nxd_validate_config(nxd_config: RunConfig) -> None:
    # the options and the device are judged when the config is made: before `nxd train` starts a rank
    if NAME not in nxd_config.model_transforms:
        return  # FP8 is off
    from nxd_fp8.transform import check_device, options_of

    check_device(options_of(nxd_config))
