"""A rank's heartbeat to its node's ``nxd train``, independent of collectives: a thread sends the
rank's progress (:data:`nxd_training.rank_status.progress`) as a UDP datagram to the launcher every
interval. It runs while the main thread waits in a collective (the wait releases the GIL), so a rank
that sends nothing is one whose process cannot run at all (stopped, a frozen host); one that beats
without completing steps is alive but stuck. :mod:`nxd_training.hang_watch` decides which."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from typing import Any

#: where the launcher listens (``127.0.0.1:PORT``: a node's ranks beat to their own node's launcher)
ADDR_ENV = "NXD_HEARTBEAT_ADDR"
#: a per-launch secret each beat carries, so stray datagrams to the port are ignored
TOKEN_ENV = "NXD_HEARTBEAT_TOKEN"
#: seconds between beats
INTERVAL_ENV = "NXD_HEARTBEAT_INTERVAL"
#: the least time between two beats
MIN_GAP_S = 0.05


def message(token: str, rank: int, progress: dict[str, Any]) -> bytes:
    """One beat: the rank, its process, the step in progress, the last completed one, the phase."""
    return json.dumps({"token": token, "rank": rank, "pid": os.getpid(), "step": progress.get("step"),
                       "done": progress.get("done"), "phase": progress.get("phase")}).encode()


def start(rank: int, progress: dict[str, Any], changed: threading.Event) -> threading.Thread | None:
    """Beat to the launcher named in the environment until the process ends (a daemon thread): every
    interval, and within :data:`MIN_GAP_S` of a change (``changed`` set: a new step, a new phase), so
    a rank stopped right after a step began is reported at that step. None when no launcher listens
    (a rank started by a bare torchrun, or the heartbeat is off)."""
    addr, token = os.environ.get(ADDR_ENV), os.environ.get(TOKEN_ENV, "")
    if not addr:
        return None
    host, port = addr.rsplit(":", 1)
    interval = float(os.environ.get(INTERVAL_ENV, "1"))
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)

    def beat() -> None:
        while True:
            try:
                sock.sendto(message(token, rank, progress), (host, int(port)))
            except OSError:  # the launcher is gone: the parent-death signal ends this process
                pass
            changed.wait(interval)
            changed.clear()
            time.sleep(MIN_GAP_S)  # fast steps: at most 1 / MIN_GAP_S beats a second

    thread = threading.Thread(target=beat, name="nxd-heartbeat", daemon=True)
    thread.start()
    return thread
