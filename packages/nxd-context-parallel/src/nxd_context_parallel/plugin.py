"""nxd plugin entry point for nxd-context-parallel: the ``context_parallel`` model transform."""

from __future__ import annotations

from typing import Any

import nxd

NXD_PLUGIN_API = (4, 4)  # plugin-API versions this plugin supports (inclusive range)


@nxd.hookimpl
def nxd_register_model_transforms(registry: Any) -> None:
    from nxd.transforms import ModelTransform, When
    from nxd_context_parallel.transform import apply_context_parallel

    registry.add("context_parallel", ModelTransform(
        "context_parallel", "context_parallel", apply_context_parallel, When("context_parallel_size", above=1),
        description="ring attention over CP in the attention modules the plan names context_parallel; "
                    "the forward takes this CP rank's chunks of each sequence"))
