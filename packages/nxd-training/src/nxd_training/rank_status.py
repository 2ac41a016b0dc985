"""What each rank leaves behind for the launcher's final line (``<run>/.ranks/``): the step it was
on and how it ended (finished, an exception, or an early exit without one). Signals leave nothing;
torchrun reports those (:mod:`nxd_training.failure` combines both)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

STATUS_DIR = ".ranks"

#: the step this rank is in (the trainer keeps it current) and the run's last step
progress = {"step": 0, "max_steps": None}


def identity() -> dict[str, int]:
    """This rank's global rank, node (torchrun's GROUP_RANK) and local rank."""
    env = os.environ
    return {"rank": int(env.get("RANK", 0)), "node": int(env.get("GROUP_RANK", 0)),
            "local_rank": int(env.get("LOCAL_RANK", 0))}


def write(run_dir: Path, how: str, what: str = "", code: int | None = None) -> None:
    """Record how this rank ended (``finished``, ``exception``, ``exit``); never raises."""
    record = {**identity(), "how": how, "what": what, "code": code, "time": time.time(),
              "step": progress["step"], "max_steps": progress["max_steps"]}
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


def clear(run_dir: Path) -> None:
    """Forget a previous launch's records (the launcher, before it starts the ranks)."""
    for path in (run_dir / STATUS_DIR).glob("rank_*.json*"):
        try:
            path.unlink()
        except OSError:
            pass
