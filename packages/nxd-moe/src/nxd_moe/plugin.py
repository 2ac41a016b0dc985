"""nxd plugin entry point for nxd-moe: a library for model plugins (its presence is what lets a
core-only install name the package to install for ``model.moe``). It registers the
``expert_parallel`` model transform (a plan's experts split over EP and TP) and attaches the
aux-loss-free expert-bias update to the optimizer of a model that uses it."""

from __future__ import annotations

from typing import Any

import nxd

NXD_PLUGIN_API = (3, 3)  # plugin-API versions this plugin supports (inclusive range)


@nxd.hookimpl
def nxd_wrap_optimizer(nxd_config: dict, optimizer: Any, context: Any) -> None:
    """After every step, move the expert biases of the routers this optimizer trains against their
    load summed over the data x context parallel ranks (:mod:`nxd_moe.balancer`); keeps the optimizer."""
    from nxd_moe.balancer import attach_expert_bias_update, routers_of_optimizer

    routers = routers_of_optimizer(optimizer)
    if routers:
        group = None if context is None else (context.dp_cp.group if context.cp.size > 1 else context.dp.group)
        attach_expert_bias_update(optimizer, routers, group)
    return None


@nxd.hookimpl
def nxd_register_model_transforms(registry: Any) -> None:
    from nxd_moe.expert_plan import EXPERT_PARALLEL_TRANSFORM

    registry.add(EXPERT_PARALLEL_TRANSFORM.name, EXPERT_PARALLEL_TRANSFORM)
