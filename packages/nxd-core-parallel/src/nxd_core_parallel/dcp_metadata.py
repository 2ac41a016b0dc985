"""DCP's ``.metadata`` read without running code: the one restricted unpickler of nxd's DCP readers
(nxd-ckpt's one-process folders and NxD-written optimizer state, nxd-fsdp's ``load_dcp``), also used
for the per-rank ``write_results.tmp.<rank>`` files NxD's ZeRO-1 DCP save passes to rank 0.

``.metadata`` is a plain pickle (``pickle.dump`` of DCP's ``Metadata``), not a ``torch.save`` zip,
so ``torch.load(weights_only=True)`` cannot read it; torch's own reader unpickles anything, code
included. This unpickler builds DCP's metadata classes, ``torch.Size``, dtypes, layouts, paths and
plain containers only; anything else is refused naming the file (never advising
``weights_only=False``).
"""

from __future__ import annotations

import io
import logging
import pickle
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from nxd.errors import NxdError

__all__ = ["DcpMetadataError", "load_dcp_metadata", "load_dcp_write_results", "quiet_metadata_fallback"]

#: modules whose classes (types only: no function of the file's choosing) a DCP ``.metadata`` may name
_METADATA_MODULES = ("torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem",
                     "torch.distributed.checkpoint.planner", "torch.distributed.checkpoint._extension",
                     "torch.distributed.checkpoint.storage")
_BUILTINS = {"set", "frozenset", "dict", "list", "tuple", "slice", "bytes", "bytearray", "int", "float", "str", "bool",
             "complex"}
_PATHS = {"PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"}  # the checkpoint id DCP records


class DcpMetadataError(NxdError, ValueError):
    """A DCP ``.metadata`` that is not one (damaged, or naming code); the message names the file."""


class _MetadataUnpickler(pickle.Unpickler):
    def __init__(self, file: Any, where: str) -> None:
        super().__init__(file)
        self.where = where

    def find_class(self, module: str, name: str) -> Any:
        if module in _METADATA_MODULES and not name.startswith("__"):
            obj = super().find_class(module, name)
            if isinstance(obj, type):
                return obj
        if module == "torch":
            value = getattr(torch, name, None)
            if value is torch.Size or isinstance(value, (torch.dtype, torch.layout, torch.memory_format)):
                return value
        if (module, name) == ("torch.serialization", "_get_layout"):  # torch.strided & co: a lookup by name
            return super().find_class(module, name)
        if (module == "pathlib" and name in _PATHS) or (module == "builtins" and name in _BUILTINS):
            return super().find_class(module, name)
        if (module, name) == ("collections", "OrderedDict"):
            return OrderedDict
        raise pickle.UnpicklingError(f"it names {module}.{name}, which DCP metadata never holds")


def load_dcp_metadata(data: bytes, where: str) -> Any:
    """DCP's ``Metadata`` from the bytes of the file ``where``; :class:`DcpMetadataError` naming it
    for anything else (a pickle that would run code included)."""
    from torch.distributed.checkpoint.metadata import Metadata

    try:
        meta = _MetadataUnpickler(io.BytesIO(data), where).load()
    except Exception as exc:  # noqa: BLE001 - any failure of a damaged file: named, never torch's advice
        raise DcpMetadataError(f"{where}: not a DCP metadata file ({type(exc).__name__}: {exc}); the checkpoint is "
                               "damaged or was not written by DCP: restore that file or the folder") from None
    if not isinstance(meta, Metadata) or not isinstance(getattr(meta, "storage_data", None), dict):
        raise DcpMetadataError(f"{where}: not a DCP metadata file (it holds {type(meta).__name__}); the checkpoint "
                               "is damaged: restore that file or the folder")
    return meta


def load_dcp_write_results(data: bytes, where: str) -> list[Any]:
    """One rank's list of DCP ``WriteResult`` from the bytes of the file ``where`` (NxD's ZeRO-1 DCP
    save pickles them for rank 0); :class:`DcpMetadataError` naming it for anything else."""
    from torch.distributed.checkpoint.storage import WriteResult

    try:
        results = _MetadataUnpickler(io.BytesIO(data), where).load()
    except Exception as exc:  # noqa: BLE001 - any failure of a damaged file: named, never torch's advice
        raise DcpMetadataError(f"{where}: not a DCP write-results file ({type(exc).__name__}: {exc}); the save "
                               "was interrupted or the folder damaged: save again") from None
    if not isinstance(results, list) or not all(isinstance(r, WriteResult) for r in results):
        raise DcpMetadataError(f"{where}: not a DCP write-results file (it holds {type(results).__name__}); "
                               "the folder is damaged: save again")
    return results


#: what DCP's loader logs (on the root logger, with a traceback each) when ``.metadata`` cannot be read
_FALLBACK = ("Global metadata is not found", "Rank local metadata is not found")


def _not_fallback(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith(_FALLBACK)


@contextmanager
def quiet_metadata_fallback() -> Iterator[None]:
    """Around an nxd DCP load: drop DCP's "Global metadata is not found. Falling back to rank local
    metadata" and "Rank local metadata is not found" warnings and their tracebacks (torch logs them on
    the root logger before its own error), so nxd's one error naming the file is what the user reads."""
    root = logging.getLogger()
    root.addFilter(_not_fallback)
    try:
        yield
    finally:
        root.removeFilter(_not_fallback)
