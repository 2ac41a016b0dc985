"""nxd plugin entry point for nxd-models-qwen3: registers the ``qwen3`` and ``qwen3_moe`` model specs."""

from __future__ import annotations

from typing import Any

import nxd

NXD_PLUGIN_API = (3, 3)  # plugin-API versions this plugin supports (inclusive range)


@nxd.hookimpl
def nxd_register_models(registry: Any) -> None:
    from nxd_models_qwen3.spec import QWEN3_MOE_SPEC, QWEN3_SPEC

    registry.add("qwen3", QWEN3_SPEC, presets=sorted(QWEN3_SPEC.presets))
    registry.add("qwen3_moe", QWEN3_MOE_SPEC, presets=sorted(QWEN3_MOE_SPEC.presets))
