"""nxd plugin entry point for nxd-models-transformers: registers the ``transformers`` model spec."""

from __future__ import annotations

from typing import Any

import nxd

NXD_PLUGIN_API = (3, 3)  # plugin-API versions this plugin supports (inclusive range)


@nxd.hookimpl
def nxd_register_models(registry: Any) -> None:
    from nxd_models_transformers.spec import NAME, SPEC

    registry.add(NAME, SPEC)
