"""Processes that die with their parent (Linux ``prctl(PR_SET_PDEATHSIG)``), so a launcher killed
with SIGKILL (a preempted job, an OOM kill) leaves no torchrun agent or rank holding the
accelerator, the rendezvous port or the run directory. Elsewhere a no-op (returns False)."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent exits; if the parent is
    already gone (it died before this call), act on it now. True where the kernel supports it."""
    if not sys.platform.startswith("linux"):
        return False
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if os.getppid() != parent:  # re-parented between fork and here: the signal would never come
        os.kill(os.getpid(), sig)
    return True
