"""nxd plugin entry point for nxd-zero1: registers this package's components with the core."""

from __future__ import annotations

from typing import Any

import nxd
from nxd.run_config import RunConfig

NXD_PLUGIN_API = (4, 4)  # plugin-API versions this plugin supports (inclusive range)


@nxd.hookimpl
def nxd_register_optimizers(registry: Any) -> None:
    from nxd_zero1.factory import make_zero1_optimizer

    registry.add("zero1", make_zero1_optimizer)


@nxd.hookimpl
def nxd_register_model_transforms(registry: Any) -> None:
    from nxd_zero1.factory import ZERO1_TRANSFORM

    registry.add(ZERO1_TRANSFORM.name, ZERO1_TRANSFORM)


@nxd.hookimpl
def nxd_validate_config(nxd_config: RunConfig) -> None:
    from nxd_zero1.factory import validate_mixed_precision

    if nxd_config.optimizer.zero_one_enabled:
        validate_mixed_precision(nxd_config.mixed_precision_config)
