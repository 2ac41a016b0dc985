"""nxd plugin entry point for nxd-tensor-parallel: the model transforms of
:mod:`nxd_tensor_parallel.transforms` (``parallel_plan``, ``pad_model``)."""

from __future__ import annotations

from typing import Any

import nxd

NXD_PLUGIN_API = (4, 4)  # plugin-API versions this plugin supports (inclusive range)


@nxd.hookimpl
def nxd_register_model_transforms(registry: Any) -> None:
    from nxd_tensor_parallel.transforms import TRANSFORMS

    for transform in TRANSFORMS:
        registry.add(transform.name, transform)
