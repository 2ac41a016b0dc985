"""The nxd plugin manager imports ``nxd_lightning.plugin`` in every ``nxd`` command and rank:
that must not import ``lightning`` (about 20 s), which loads only when a Lightning class is used."""

from __future__ import annotations

import subprocess
import sys


def test_plugin_discovery_does_not_import_lightning() -> None:
    code = ("import sys, nxd; nxd.list_components('model'); import nxd_lightning.plugin; "
            "assert 'lightning' not in sys.modules, 'lightning imported at discovery'; "
            "from nxd_lightning import NeuronLTModule, NxDStrategy; assert 'lightning' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)
