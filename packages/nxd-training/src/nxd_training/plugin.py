"""nxd plugin entry point for nxd-training: the ``train``, ``plot``, ``eval`` and ``generate`` verbs of the
``nxd`` command."""

from __future__ import annotations

import nxd

NXD_PLUGIN_API = (3, 3)  # plugin-API versions this plugin supports (inclusive range)


@nxd.hookimpl
def nxd_register_commands(registry) -> None:
    from nxd_training.cli import PLOT, TRAIN
    from nxd_training.eval_cli import EVAL, GENERATE

    registry.add("train", TRAIN)
    registry.add("plot", PLOT)
    registry.add("eval", EVAL)
    registry.add("generate", GENERATE)
