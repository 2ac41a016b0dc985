"""Copy state to host memory so a later training step cannot change what gets written."""

from __future__ import annotations

import collections
import copy
from typing import Any

import torch


def to_cpu(obj: Any, clone: bool) -> Any:
    """``obj`` with every tensor moved to CPU; ``clone=True`` copies CPU tensors too (async save)."""
    if isinstance(obj, torch.Tensor):
        t = obj.detach()
        if t.device.type != "cpu":
            return t.to("cpu")
        return t.clone() if clone else t
    if isinstance(obj, dict):
        out = {k: to_cpu(v, clone) for k, v in obj.items()}
        return collections.OrderedDict(out) if isinstance(obj, collections.OrderedDict) else out
    if isinstance(obj, list):
        return [to_cpu(v, clone) for v in obj]
    if isinstance(obj, tuple):
        items = [to_cpu(v, clone) for v in obj]
        return type(obj)(*items) if hasattr(obj, "_fields") else tuple(items)
    return copy.deepcopy(obj) if clone else obj


def unwrap_model(model: Any) -> Any:
    """The module whose ``state_dict`` holds this rank's (global-named) parameters."""
    local = getattr(model, "local_module", None)
    return local() if callable(local) else model
