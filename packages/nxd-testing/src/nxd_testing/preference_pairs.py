"""A synthetic preference set whose chosen responses follow a learnable rule (the chosen response
repeats the prompt's word; the rejected one names two other words): nxd-alignment's tests and the
composition matrix train DPO/ORPO on it (the ``pairs_file`` fixture of nxd-testing's pytest plugin)."""

from __future__ import annotations

import json
import random
from pathlib import Path

WORDS = ["king", "love", "night", "sword", "crown", "heart", "storm", "blood"]


def write_preference_pairs(path: Path, n: int = 64) -> Path:
    """Write ``n`` ``{prompt, chosen, rejected}`` records to the JSONL file ``path``."""
    rng = random.Random(0)
    with path.open("w") as f:
        for i in range(n):
            w = WORDS[i % len(WORDS)]
            a, b = rng.sample([x for x in WORDS if x != w], 2)
            f.write(json.dumps({"prompt": f"Say {w} twice:", "chosen": f" {w} {w}", "rejected": f" {a} {b}"}) + "\n")
    return path
