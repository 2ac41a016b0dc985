"""Checkpoint helpers: every stage's state dict uses global names, so merging is a union."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def merge_stage_state_dicts(state_dicts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Union of the state dicts of a pipeline's ranks: the unsplit model's state dict. A key held
    by several stages (a tied weight) must carry the same value everywhere."""
    merged: dict[str, Any] = {}
    for rank, sd in enumerate(state_dicts):
        for key, value in sd.items():
            if key in merged and isinstance(value, torch.Tensor) and not torch.equal(merged[key], value):
                raise ValueError(f"pipeline rank {rank} holds {key!r} with a value different from an earlier rank's")
            merged.setdefault(key, value)
    return merged
