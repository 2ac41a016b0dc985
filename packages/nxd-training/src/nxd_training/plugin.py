"""nxd plugin entry point for nxd-training: the ``train`` and ``plot`` verbs of the ``nxd`` command."""

from __future__ import annotations

import nxd

NXD_PLUGIN_API = (3, 3)  # plugin-API versions this plugin supports (inclusive range)


@nxd.hookimpl
def nxd_register_commands(registry) -> None:
    from nxd_training.cli import PLOT, TRAIN

    registry.add("train", TRAIN)
    registry.add("plot", PLOT)
