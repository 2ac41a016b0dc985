"""torch-xla's "xser" checkpoint layout, written and read with torch alone.

``torch_xla.utils.serialization.save(data, path)`` writes ``path`` (the data with every tensor
replaced by a ``TensorReference(tid, shape, dtype)``) and one ``path.tensors/tensor_<tid>.pt`` per
tensor. NxD writes it with ``save_xser=True`` / ``use_xser=True`` (``parallel_layers.save``,
``save_checkpoint``, its checkpoint converter). nxd-ckpt reads NxD's xser checkpoints through it
(:func:`load_from_storage`); nxd-compat writes the layout with it.
The reference class is pickled under torch-xla's module name, so files written here are read by
torch-xla and files torch-xla wrote are read here (with ``weights_only=True``: no code runs).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import types
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from nxd_ckpt.errors import CheckpointError
from nxd_ckpt.storage import Storage

TENSORS_SUFFIX = ".tensors"


class TensorReference:
    """torch-xla's placeholder for a tensor stored in its own file."""

    def __init__(self, tid: int, shape: Any = None, dtype: Any = None) -> None:
        self.tid, self.shape, self.dtype = tid, shape, dtype


# pickled (and allow-listed for weights_only loads) under the name torch-xla gives it
TensorReference.__module__ = "torch_xla.utils.serialization"


@contextlib.contextmanager
def _picklable() -> Iterator[None]:
    """pickle imports a class by its name: where neither torch-xla nor the stand-in is on the
    path, torch-xla's module name resolves to this module while a file is written or read."""
    name = TensorReference.__module__
    if name in sys.modules or importlib.util.find_spec("torch_xla") is not None:
        yield
        return
    added = {}
    for part in ("torch_xla", "torch_xla.utils", name):
        added[part] = sys.modules[part] = types.ModuleType(part)
    added[name].TensorReference = TensorReference  # type: ignore[attr-defined]
    try:
        yield
    finally:
        for part, module in added.items():
            if sys.modules.get(part) is module:
                del sys.modules[part]


def tensor_file(path: str, tid: int) -> str:
    return os.path.join(path + TENSORS_SUFFIX, f"tensor_{tid}.pt")


def is_xser(path: str) -> bool:
    """Whether ``path`` is the reference file of an xser checkpoint."""
    return os.path.isfile(path) and os.path.isdir(path + TENSORS_SUFFIX)


def _map(data: Any, fn: Any) -> Any:
    if isinstance(data, dict):
        return type(data)((k, _map(v, fn)) for k, v in data.items()) if not hasattr(data, "default_factory") \
            else {k: _map(v, fn) for k, v in data.items()}
    if isinstance(data, list):
        return [_map(v, fn) for v in data]
    if isinstance(data, tuple) and not hasattr(data, "_fields"):
        return tuple(_map(v, fn) for v in data)
    return fn(data)


def _is_master(global_master: bool) -> bool:
    if not (dist.is_available() and dist.is_initialized()):
        return True
    if global_master:
        return dist.get_rank() == 0
    return int(os.environ.get("LOCAL_RANK", dist.get_rank())) == 0


def save(data: Any, path: str, master_only: bool = True, global_master: bool = False) -> None:
    """torch-xla's signature: with ``master_only`` only the (global, or local) master writes."""
    if master_only and not _is_master(global_master):
        return
    os.makedirs(path + TENSORS_SUFFIX, exist_ok=True)
    counter = iter(range(1 << 62))

    def store(value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        tid = next(counter)
        torch.save(value.detach().cpu().clone(), tensor_file(path, tid))
        return TensorReference(tid, tuple(value.shape), value.dtype)

    refs = _map(data, store)
    with _picklable():
        torch.save(refs, path)


@contextlib.contextmanager
def reading_references() -> Iterator[None]:
    """While a reference file is ``torch.load``-ed: its ``TensorReference`` unpickles (also with
    ``weights_only=True``)."""
    with torch.serialization.safe_globals([TensorReference]), _picklable():
        yield


def resolve_references(ref_data: Any, path: str) -> Any:
    """``ref_data`` (read from the reference file ``path``) with each reference replaced by its
    tensor, on the CPU."""

    def fetch(value: Any) -> Any:
        if isinstance(value, TensorReference):
            return torch.load(tensor_file(path, value.tid), map_location="cpu", weights_only=True)
        return value

    return _map(ref_data, fetch)


def load(path: str, weights_only: bool = True) -> Any:
    """The data saved at ``path``, tensors on the CPU."""
    with reading_references():
        ref_data = torch.load(path, map_location="cpu", weights_only=weights_only)
    return resolve_references(ref_data, path)


#: NxD's ``save_checkpoint(use_xser=True)`` writes this beside each reference file (tensor shapes/dtypes)
NXD_INFO_SUFFIX = ".info.pt"


def is_xser_in_storage(storage: Storage, path: str) -> bool:
    """``path`` in ``storage`` is an xser reference file (its ``.tensors`` folder holds files, or
    NxD's ``.info.pt`` sits beside it)."""
    return bool(storage.list_files(path + TENSORS_SUFFIX)) or storage.exists(path + NXD_INFO_SUFFIX)


def load_from_storage(storage: Storage, path: str) -> Any:
    """An xser file of a checkpoint storage (local or fsspec), tensors on the CPU; nothing is
    unpickled but tensors and torch-xla's references (``weights_only``)."""
    import io

    def read(rel: str) -> Any:
        with storage.open_read(rel) as f:
            return torch.load(io.BytesIO(f.read()), map_location="cpu", weights_only=True)

    with torch.serialization.safe_globals([TensorReference]):
        ref_data = read(path)

    def fetch(value: Any) -> Any:
        if isinstance(value, TensorReference):
            rel = f"{path}{TENSORS_SUFFIX}/tensor_{value.tid}.pt"
            if not storage.exists(rel):
                raise CheckpointError(
                    f"{storage.describe(rel)}: missing. NxD writes xser references without their tensors when "
                    "save_checkpoint(avoid_saving_lower_precision_weights=True) keeps the model only as ZeRO-1 "
                    "master weights in optim/; nxd cannot rebuild the model from those (which optimizer index is "
                    "which parameter is not recorded): save the NxD checkpoint without that option")
            return read(rel)
        return value

    return _map(ref_data, fetch)
