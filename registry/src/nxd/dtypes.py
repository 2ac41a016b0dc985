"""The dtype names nxd's configs accept, in one table: NxD/NxDT's short names (``fp32``, ``bf16``)
and torch's (``float32``, ``bfloat16``). A config keeps torch's name; :func:`torch_dtype` turns it back."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from nxd.errors import ConfigError

#: accepted name -> dtype
DTYPE_NAMES: dict[str, torch.dtype] = {
    "fp32": torch.float32, "float32": torch.float32,
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    "fp16": torch.float16, "float16": torch.float16,
}


def dtype_name(value: Any, field: str, allowed: Iterable[torch.dtype] | None = None) -> str | None:
    """``value`` (a name of :data:`DTYPE_NAMES` or a ``torch.dtype``; ``None`` passes) as torch's name
    (``"bfloat16"``); a :class:`ConfigError` naming ``field`` and the valid names otherwise.
    ``allowed``: the dtypes ``field`` takes (default: every dtype of the table)."""
    if value is None:
        return None
    name = str(value).removeprefix("torch.") if isinstance(value, torch.dtype) else value
    allowed = set(DTYPE_NAMES.values() if allowed is None else allowed)
    valid = [n for n, d in DTYPE_NAMES.items() if d in allowed]
    if not isinstance(name, str) or name not in valid:
        raise ConfigError(f"{field} must be one of {', '.join(valid)} (or the torch dtype), got {value!r}")
    return str(DTYPE_NAMES[name]).removeprefix("torch.")


def torch_dtype(name: str | None) -> torch.dtype | None:
    """A name :func:`dtype_name` accepts (or returned) as the ``torch.dtype``; ``None`` passes."""
    return None if name is None else DTYPE_NAMES[name]
