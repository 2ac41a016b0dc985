"""Weights-only loading of Megatron-LM / NeMo ``.pt``/``.ckpt`` files: no pickled code runs.

``torch.load(weights_only=True)`` rebuilds tensors and plain containers only. Megatron files also
pickle their ``args`` (an ``argparse.Namespace``: attribute assignment only, allowed here),
Transformer Engine ``_extra_state`` blobs (``io.BytesIO``, allowed) and, in some versions, Megatron
enums; those are rebuilt as inert :class:`MegatronEnumValue` placeholders (the name and value,
never the class). Anything else is refused with the global's name.
"""

from __future__ import annotations

import argparse
import io
import os
import pickle
import re
from typing import Any

import torch

#: Names of data-only Megatron classes rebuilt as placeholders (never imported).
_ENUM_NAME = re.compile(r"^megatron\.core(\.[A-Za-z_]+)*\.enums\.[A-Za-z_]+$")
_GLOBAL_IN_ERROR = re.compile(r"GLOBAL (\S+)|but got <class '([^']+)'>")
#: numpy's array-rebuilding globals (Megatron's ``rng_state`` holds ``np.random.get_state()``):
#: they rebuild arrays from bytes and run no file-provided code.
_NUMPY_NAME = re.compile(r"^numpy\.((_?core\.multiarray\._reconstruct)|ndarray|dtype|dtypes\.\w+DType)$")


class MegatronEnumValue:
    """Stands in for a pickled Megatron enum member: keeps its class name and value only."""

    qualname = ""

    def __init__(self, value: Any = None) -> None:
        self.value = value

    def __repr__(self) -> str:
        return f"<{self.qualname}({self.value!r})>"


def _placeholder(name: str) -> type:
    return type(name.rsplit(".", 1)[1], (MegatronEnumValue,), {"qualname": name})


def _resolve_numpy(name: str) -> Any:
    import numpy as np

    attr = name.rsplit(".", 1)[1]
    if name.endswith("._reconstruct"):
        return np.ndarray.__reduce__(np.zeros(0))[0]  # numpy's own array-rebuilding function
    if name.startswith("numpy.dtypes."):
        return getattr(np.dtypes, attr)
    return getattr(np, attr)


class UnsafeCheckpointError(ValueError):
    """The file needs a pickled global nxd does not rebuild (it would run code from the file)."""


def load_weights_only(path: str | os.PathLike) -> Any:
    """Load ``path`` without executing pickled code (see the module docstring)."""
    allowed: list[Any] = [argparse.Namespace, io.BytesIO]
    for _ in range(32):  # one retry per distinct Megatron enum the file names
        try:
            with torch.serialization.safe_globals(allowed):
                return torch.load(path, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as err:
            match = _GLOBAL_IN_ERROR.search(str(err))
            name = (match.group(1) or match.group(2)) if match else None
            if name and _ENUM_NAME.match(name):
                allowed.append((_placeholder(name), name))
                continue
            if name and _NUMPY_NAME.match(name):
                allowed.append((_resolve_numpy(name), name))
                continue
            raise UnsafeCheckpointError(
                f"{path}: refused to unpickle {name or 'an object'}: nxd loads Megatron/NeMo checkpoints "
                "weights-only and never runs code stored in a file; this file needs that global. Re-save the "
                "model weights alone (a dict of tensors), or convert it with a trusted tool first."
            ) from None
    raise UnsafeCheckpointError(f"{path}: too many distinct pickled Megatron classes")
