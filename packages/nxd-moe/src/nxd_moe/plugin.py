"""nxd plugin entry point for nxd-moe: a library for model plugins (its presence is what lets a
core-only install name the package to install for ``model.moe``). It registers the
``expert_parallel`` model transform (a plan's experts split over EP and TP; after each optimizer
step, the aux-loss-free expert-bias update of a model that uses it)."""

from __future__ import annotations

from typing import Any

import nxd

NXD_PLUGIN_API = (4, 4)  # plugin-API versions this plugin supports (inclusive range)


@nxd.hookimpl
def nxd_register_model_transforms(registry: Any) -> None:
    from nxd_moe.expert_plan import EXPERT_PARALLEL_TRANSFORM

    registry.add(EXPERT_PARALLEL_TRANSFORM.name, EXPERT_PARALLEL_TRANSFORM)
