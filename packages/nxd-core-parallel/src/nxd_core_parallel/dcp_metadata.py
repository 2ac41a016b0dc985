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
from collections.abc import Callable, Iterator
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


def _restricted_load(data: bytes, where: str, what: str, expected: Callable[[Any], bool], unreadable: str,
                     wrong: str) -> Any:
    """The object pickled in the bytes of the file ``where``, built with DCP's classes only; a
    :class:`DcpMetadataError` naming the file (``unreadable`` / ``wrong``: what to do) when it cannot
    be read so or does not hold ``what`` (``expected``)."""
    try:
        value = _MetadataUnpickler(io.BytesIO(data), where).load()
    except Exception as exc:  # noqa: BLE001 - any failure of a damaged file: named, never torch's advice
        raise DcpMetadataError(f"{where}: not a {what} ({type(exc).__name__}: {exc}); {unreadable}") from None
    if not expected(value):
        raise DcpMetadataError(f"{where}: not a {what} (it holds {type(value).__name__}); {wrong}")
    return value


def load_dcp_metadata(data: bytes, where: str) -> Any:
    """DCP's ``Metadata`` from the bytes of the file ``where``; :class:`DcpMetadataError` naming it
    for anything else (a pickle that would run code included)."""
    from torch.distributed.checkpoint.metadata import Metadata

    return _restricted_load(
        data, where, "DCP metadata file",
        lambda meta: isinstance(meta, Metadata) and isinstance(getattr(meta, "storage_data", None), dict),
        "the checkpoint is damaged or was not written by DCP: restore that file or the folder",
        "the checkpoint is damaged: restore that file or the folder")


def load_dcp_write_results(data: bytes, where: str) -> list[Any]:
    """One rank's list of DCP ``WriteResult`` from the bytes of the file ``where`` (NxD's ZeRO-1 DCP
    save pickles them for rank 0); :class:`DcpMetadataError` naming it for anything else."""
    from torch.distributed.checkpoint.storage import WriteResult

    return _restricted_load(
        data, where, "DCP write-results file",
        lambda results: isinstance(results, list) and all(isinstance(r, WriteResult) for r in results),
        "the save was interrupted or the folder damaged: save again", "the folder is damaged: save again")


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
