"""What each rank leaves behind for the launcher's final line (``<run>/.ranks/``): the step it was
on and how it ended (finished, an exception, or an early exit without one). Signals leave nothing;
torchrun reports those (:mod:`nxd_training.failure` combines both)."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

STATUS_DIR = ".ranks"

#: the step this rank is in, the last one it completed (the trainer keeps both current), the run's last step
#: and what the rank is doing (``train``: steps; ``checkpoint``, ``validation``, ``finish``; None: starting)
progress = {"step": 0, "done": None, "max_steps": None, "phase": None}


#: set on every :func:`update`, so the heartbeat reports a new step at once, not up to a beat later
changed = threading.Event()


def update(**fields: object) -> None:
    """Set fields of :data:`progress` (the trainer's only way to change it)."""
    progress.update(fields)
    changed.set()


@contextmanager
def phase(name: str) -> Iterator[None]:
    """Mark this rank's phase for the heartbeat (a save or validation is no training step), then restore it."""
    before = progress["phase"]
    update(phase=name)
    try:
        yield
    finally:
        update(phase=before)


#: the launcher's node rank, as the user knows the node (SLURM_NODEID, PET_NODE_RANK, launcher.node_rank);
#: torchrun's GROUP_RANK is the rendezvous' own order, which a c10d rendezvous assigns as nodes arrive
NODE_ENV = "NXD_NODE_RANK"


def identity() -> dict[str, int | str]:
    """This rank's global rank, node (the launcher's node rank, else torchrun's GROUP_RANK), its
    group (GROUP_RANK), local rank and host."""
    env = os.environ
    group = int(env.get("GROUP_RANK", 0))
    return {"rank": int(env.get("RANK", 0)), "node": int(env.get(NODE_ENV, group)), "group": group,
            "local_rank": int(env.get("LOCAL_RANK", 0)), "host": socket.gethostname()}


def brief(text: str, limit: int = 480) -> str:
    """``text`` within ``limit`` characters, its middle elided: an error's cause is often at its end
    (a long path first, ``... No space left on device`` last)."""
    if len(text) <= limit:
        return text
    half = (limit - 5) // 2
    return f"{text[:half]} ... {text[-half:]}"


def write(run_dir: Path, how: str, what: str = "", code: int | None = None, collective: dict | None = None) -> None:
    """Record how this rank ended (``finished``, ``exception``, ``exit``); never raises. ``collective``:
    the collective that timed out on this rank (:func:`nxd_training.hang.locate_collective`)."""
    record = {**identity(), "how": how, "what": what, "code": code, "time": time.time(),
              "step": progress["step"], "done": progress["done"], "max_steps": progress["max_steps"],
              "collective": collective}
    try:
        folder = run_dir / STATUS_DIR
        folder.mkdir(exist_ok=True)
        tmp = folder / f"rank_{record['rank']}.json.tmp"
        tmp.write_text(json.dumps(record))
        os.replace(tmp, folder / f"rank_{record['rank']}.json")
    except OSError:
        pass


def read_all(run_dir: Path) -> dict[int, dict]:
    out = {}
    for path in sorted((run_dir / STATUS_DIR).glob("rank_*.json")):
        try:
            record = json.loads(path.read_text())
            out[int(record["rank"])] = record
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out


def completed_step(run_dir: Path) -> int | None:
    """The last step the run completed as its log shows it: rank 0's record (rank 0 writes
    ``metrics.jsonl`` and sets ``done`` after a step's log line; another rank may be a step ahead or
    behind when the stop lands), else the newest other record, else this process's own progress (a
    one-device run trains in the launcher); None when nothing knows."""
    records = read_all(run_dir)
    if records.get(0, {}).get("done") is not None:
        return records[0]["done"]
    done = [r["done"] for r in records.values() if r.get("done") is not None]
    if done:
        return max(done)
    return progress["done"]


def clear(run_dir: Path) -> None:
    """Forget a previous launch's records (the launcher, before it starts the ranks)."""
    for path in (run_dir / STATUS_DIR).glob("rank_*"):  # records and stack dumps (nxd_training.hang)
        try:
            path.unlink()
        except OSError:
            pass
