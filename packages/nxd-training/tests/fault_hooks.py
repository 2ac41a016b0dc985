"""Fault injection through the interpreter's startup hook: a ``sitecustomize.py`` on PYTHONPATH,
which torchrun's ranks inherit. Shared by the launch-fault and multi-node tests."""

from __future__ import annotations

import os
from pathlib import Path

#: rank 1 dies once rank 0 has logged 3 steps: by SIGSEGV, or by a clean os._exit(0) mid-training
DIE_AT_STEP = """
import os, signal, threading, time
if os.environ.get("RANK") == "1" and os.environ.get("TORCHELASTIC_RUN_ID"):
    def _watch():
        metrics = os.environ["NXD_TEST_METRICS"]
        while not (os.path.exists(metrics) and sum(1 for _ in open(metrics)) >= 3):
            time.sleep(0.05)
        if os.environ["NXD_TEST_DEATH"] == "segv":
            os.kill(os.getpid(), signal.SIGSEGV)
            time.sleep(600)
        os._exit(0)
    threading.Thread(target=_watch, daemon=True).start()
"""


def rank1_dies_env(tmp_path: Path, metrics: Path, death: str) -> dict[str, str]:
    """The environment that makes rank 1 die (``death``: ``segv`` or ``exit0``) once ``metrics``
    has 3 lines."""
    hooks = tmp_path / "hooks"
    hooks.mkdir(exist_ok=True)
    (hooks / "sitecustomize.py").write_text(DIE_AT_STEP)
    paths = os.pathsep.join(p for p in (str(hooks), os.environ.get("PYTHONPATH")) if p)
    return {"PYTHONPATH": paths, "NXD_TEST_METRICS": str(metrics), "NXD_TEST_DEATH": death}
