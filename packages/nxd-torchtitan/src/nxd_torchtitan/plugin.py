"""nxd plugin entry point for nxd-torchtitan: registers the ``torchtitan`` checkpoint converter."""

from __future__ import annotations

from typing import Any

import nxd

NXD_PLUGIN_API = (3, 3)  # plugin-API versions this plugin supports (inclusive range)


@nxd.hookimpl
def nxd_register_checkpoint_converters(registry: Any) -> None:
    from nxd_torchtitan.convert import TORCHTITAN_CONVERTER

    registry.add("torchtitan", TORCHTITAN_CONVERTER)
