"""nxd plugin entry point for nxd-models-llama: registers the ``llama`` and ``mistral`` model specs."""

from __future__ import annotations

from typing import Any

import nxd

NXD_PLUGIN_API = (3, 3)  # plugin-API versions this plugin supports (inclusive range)


@nxd.hookimpl
def nxd_register_models(registry: Any) -> None:
    from nxd_models_llama.spec import MISTRAL_SPEC, SPEC

    registry.add("llama", SPEC, presets=sorted(SPEC.presets))
    registry.add("mistral", MISTRAL_SPEC, presets=sorted(MISTRAL_SPEC.presets))
