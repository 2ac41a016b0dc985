"""nxd plugin entry point for nxd-alignment: registers the DPO and ORPO workflows."""

from __future__ import annotations

from typing import Any

import nxd

NXD_PLUGIN_API = (3, 3)  # plugin-API versions this plugin supports (inclusive range)


@nxd.hookimpl
def nxd_register_workflows(registry: Any) -> None:
    from nxd_alignment.workflows import dpo, orpo

    registry.add("dpo", dpo, description="Direct Preference Optimization (sigmoid/ipo/hinge) with a frozen reference")
    registry.add("orpo", orpo, description="Odds-Ratio Preference Optimization (SFT loss + odds-ratio term)")
