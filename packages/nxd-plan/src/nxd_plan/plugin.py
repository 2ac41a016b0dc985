"""nxd plugin entry point for nxd-plan: the ``plan`` verb and the ``meta`` backend its dry runs use."""

from __future__ import annotations

import nxd

NXD_PLUGIN_API = (3, 3)  # plugin-API versions this plugin supports (inclusive range)


@nxd.hookimpl
def nxd_register_commands(registry) -> None:
    from nxd_plan.cli import PLAN

    registry.add("plan", PLAN)


@nxd.hookimpl
def nxd_register_backends(registry) -> None:
    from nxd_plan.fake_world import MetaBackend

    registry.add("meta", MetaBackend())


@nxd.hookimpl
def nxd_plan_run(config, device_memory_gib):
    from nxd_plan.launch_check import plan_before_launch

    return plan_before_launch(config, device_memory_gib)
