"""Capture and restore every random number generator a training step draws from.

Python's ``random``, NumPy's global generator, torch's CPU generator (and CUDA's when present) and
nxd-core-parallel's TP RNG tracker. States are stored as tensors and plain Python values so the
file loads with ``weights_only=True``.
"""

from __future__ import annotations

import random
from typing import Any

import torch


def _tracker() -> Any:
    try:
        from nxd_core_parallel.random import get_rng_tracker
    except ImportError:
        return None
    return get_rng_tracker()


def capture_rng_state() -> dict[str, Any]:
    version, internal, gauss = random.getstate()
    state: dict[str, Any] = {
        "python": {"version": version, "state": torch.tensor(internal, dtype=torch.int64), "gauss": gauss},
        "torch": torch.get_rng_state(),
    }
    try:
        import numpy as np

        name, keys, pos, has_gauss, cached = np.random.get_state()
        state["numpy"] = {"name": str(name), "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                          "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}
    except ImportError:
        pass
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    tracker = _tracker()
    if tracker is not None:
        state["tracker"] = tracker.get_states()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    py = state["python"]
    random.setstate((py["version"], tuple(int(x) for x in py["state"].tolist()), py["gauss"]))
    torch.set_rng_state(state["torch"])
    if "numpy" in state:
        import numpy as np

        n = state["numpy"]
        np.random.set_state((n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    tracker = _tracker()
    if tracker is not None and "tracker" in state:
        tracker.set_states(state["tracker"])
