"""Integrity of torch.distributed.checkpoint (DCP) folders: nxd's checksums, and errors that name files.

``save_dcp`` writes every file through a stream that hashes the bytes as they go out (CRC-32, no
second read), and rank 0 records all ranks' digests in ``nxd_checksums.json`` before the folder is
renamed into place (DCP's readers ignore the file). ``load_dcp`` checks every file against it before
DCP reads a byte: DCP copies each tensor into the model's parameters as it reads, so a check after
the read would come too late. The ranks share the work (each hashes its share of the files; the
read DCP does next finds them in the page cache). A folder without the manifest (torchtitan's,
torch's own) is loaded with a one-line note that it is unverified, after checking that every file
its ``.metadata`` places a tensor in holds those bytes.

``.metadata`` is a pickle: it is read here by an unpickler that builds DCP's metadata classes,
``torch.Size``, dtypes and paths only (torch's reader unpickles anything, code included).
"""

from __future__ import annotations

import errno
import os
import pickle
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePath
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.filesystem import FileSystem

from nxd.errors import NxdError
from nxd.paths import check_relative, resolve_inside
from nxd_core_parallel.file_checksums import (
    MANIFEST,
    RunningDigest,
    check_digest,
    file_digest,
    read_manifest,
    write_manifest,
)

DCP_METADATA = ".metadata"
WRITER = "nxd_fsdp.save_dcp"


class DcpCheckpointError(NxdError, RuntimeError):
    """A DCP checkpoint could not be written or read; the message names the folder and file."""


# ---------------------------------------------------------------------------------------------- save
class _DigestingStream:
    """A file DCP writes: every byte is forwarded and hashed; an OSError names the file."""

    def __init__(self, raw: Any, fs: _DigestingFileSystem, path: Path) -> None:
        self._raw, self._fs, self._path = raw, fs, path
        self._digest = RunningDigest()
        self._recorded = False

    def write(self, data: Any) -> int:
        try:
            n = self._raw.write(data)
        except OSError as exc:  # the kernel's ENOSPC names no file: say which (it reaches every rank's error)
            raise OSError(exc.errno, f"{exc.strerror or exc} (writing {self._path})") from None
        self._digest.update(data)
        return n

    def tell(self) -> int:
        return self._raw.tell()

    def flush(self) -> None:
        self._raw.flush()

    def fileno(self) -> int:
        return self._raw.fileno()

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def readable(self) -> bool:
        return False

    @property
    def closed(self) -> bool:
        return self._raw.closed

    def record(self) -> None:
        if not self._recorded:
            self._recorded = True
            self._fs.record(self._path.name.removesuffix(".tmp"), self._digest.digest())  # .metadata.tmp is renamed

    def close(self) -> None:
        self._raw.close()
        self.record()


class _DigestingFileSystem(FileSystem):
    def __init__(self) -> None:
        super().__init__()
        self.digests: dict[str, dict] = {}
        self._lock = threading.Lock()  # DCP may write with several threads

    def record(self, name: str, digest: dict) -> None:
        with self._lock:
            self.digests[name] = digest

    @contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Iterator[Any]:
        with super().create_stream(path, mode) as raw:
            if "w" not in mode:
                yield raw
                return
            stream = _DigestingStream(raw, self, Path(path))
            yield stream
            stream.record()


class DigestingWriter(FileSystemWriter):
    """DCP's file writer, recording the CRC-32 of every file it writes (``self.fs.digests``)."""

    def __init__(self, path: str | os.PathLike, **kwargs: Any) -> None:
        super().__init__(path, **kwargs)
        self.fs = _DigestingFileSystem()


def save_error(path: str, exc: BaseException) -> DcpCheckpointError:
    """One line for a failed DCP save: the rank, the file and the cause (``no space left``)."""
    failures = exc.failures if isinstance(exc, CheckpointException) else {dist.get_rank() if dist.is_initialized()
                                                                           else 0: (exc, None)}
    rank, (cause, _) = min(failures.items())
    full = isinstance(cause, OSError) and cause.errno == errno.ENOSPC
    why = f"no space left on device: {cause.strerror}" if full else f"{type(cause).__name__}: {cause}"
    return DcpCheckpointError(f"DCP save to {path} failed on rank {rank}: {why}. Nothing was saved at {path} (the "
                              f"partial files are in {path}.partial: remove them); free space or save elsewhere")


def record_manifest(partial: str, writer: DigestingWriter) -> None:
    """Gather every rank's digests; rank 0 writes them into ``partial``. Collective; raises on every rank
    if rank 0 could not write the manifest."""
    gathered: list[Any] = [None] * dist.get_world_size() if dist.is_initialized() else [None]
    if dist.is_initialized():
        dist.all_gather_object(gathered, writer.fs.digests)
    else:
        gathered = [writer.fs.digests]
    failure = [None]
    if not dist.is_initialized() or dist.get_rank() == 0:
        merged = {name: d for digests in gathered for name, d in digests.items()}
        try:
            write_manifest(partial, merged, WRITER)
        except OSError as exc:
            full = exc.errno == errno.ENOSPC
            failure[0] = (f"writing {os.path.join(partial, MANIFEST)} failed: "
                          f"{'no space left on device' if full else exc}; nothing was saved (free space or save elsewhere)")
    if dist.is_initialized():
        dist.broadcast_object_list(failure, src=0)
    if failure[0]:
        raise DcpCheckpointError(failure[0])


# ---------------------------------------------------------------------------------------------- load
_METADATA_MODULES = ("torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem")


class _MetadataUnpickler(pickle.Unpickler):
    """Builds what DCP's ``.metadata`` holds and nothing else (no function calls of the file's choosing)."""

    def find_class(self, module: str, name: str) -> Any:
        obj = super().find_class(module, name) if module in _METADATA_MODULES + ("torch", "pathlib") else None
        if module in _METADATA_MODULES and isinstance(obj, type):
            return obj
        if module == "torch" and (obj is torch.Size or isinstance(obj, torch.dtype)):
            return obj
        if module == "pathlib" and isinstance(obj, type) and issubclass(obj, PurePath):
            return obj
        if (module, name) == ("torch.serialization", "_get_layout"):
            from torch.serialization import _get_layout

            return _get_layout
        if (module, name) == ("collections", "OrderedDict"):
            from collections import OrderedDict

            return OrderedDict
        raise pickle.UnpicklingError(f"it names {module}.{name}, which DCP metadata never holds")


def read_metadata(path: str) -> Any:
    """DCP's ``.metadata`` of the folder ``path``, read safely; errors name the file."""
    from torch.distributed.checkpoint.metadata import Metadata

    where = os.path.join(path, DCP_METADATA)
    try:
        with open(where, "rb") as f:
            meta = _MetadataUnpickler(f).load()
    except Exception as exc:  # noqa: BLE001 - any failure of a damaged file: named, never torch's advice
        raise DcpCheckpointError(f"{where}: not a DCP metadata file ({type(exc).__name__}: {exc}); the checkpoint "
                                 "is damaged: restore that file or the folder") from None
    if not isinstance(meta, Metadata) or not isinstance(getattr(meta, "storage_data", None), dict):
        raise DcpCheckpointError(f"{where}: not a DCP metadata file (it holds {type(meta).__name__}); the checkpoint "
                                 "is damaged: restore that file or the folder")
    return meta


class SafeReader(FileSystemReader):
    """DCP's file reader with :func:`read_metadata`'s safe, file-naming unpickler."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        from torch.distributed.checkpoint.metadata import StorageMeta

        meta = read_metadata(str(self.path))
        if getattr(meta, "storage_meta", None) is None:
            meta.storage_meta = StorageMeta()
        meta.storage_meta.load_id = self.load_id
        return meta


def _my_share(names: list[str]) -> list[str]:
    if not dist.is_initialized():
        return names
    return names[dist.get_rank()::dist.get_world_size()]


def _agree(error: str | None) -> None:
    """Raise on every rank the first error any rank found (they verified different files)."""
    errors = [error]
    if dist.is_initialized():
        errors = [None] * dist.get_world_size()
        dist.all_gather_object(errors, error)
    found = sorted(e for e in errors if e)
    if found:
        raise DcpCheckpointError(found[0])


def _verify_manifest(path: str, files: dict[str, dict]) -> str | None:
    present = sorted(e.name for e in os.scandir(path) if e.is_file() and e.name != MANIFEST)
    extra = [n for n in present if n not in files and n.endswith(".distcp")]
    if extra:
        return f"{os.path.join(path, extra[0])}: not among the files {MANIFEST} records (added after the save?)"
    try:
        for name in _my_share(sorted(files)):
            where = resolve_inside(path, check_relative(name, f"{MANIFEST} entry"), f"{MANIFEST} entry")
            if not os.path.isfile(where):
                return f"{where}: missing ({os.path.join(path, MANIFEST)} records it); restore the folder"
            others = {os.path.join(path, n): d for n, d in files.items() if n != name}
            check_digest(file_digest(where), files[name], where, "nxd saved it", others)
    except NxdError as exc:
        return str(exc)
    return None


def _check_layout(path: str) -> str | None:
    """A folder without nxd's manifest: every file ``.metadata`` places tensors in holds those bytes."""
    try:
        meta = read_metadata(path)
    except DcpCheckpointError as exc:
        return str(exc)
    needed: dict[str, tuple[int, Any]] = {}
    for index, info in meta.storage_data.items():
        end = int(info.offset) + int(info.length)
        if end > needed.get(info.relative_path, (-1, None))[0]:
            needed[info.relative_path] = (end, index)
    for name in _my_share(sorted(needed)):
        try:
            where = resolve_inside(path, check_relative(name, f"{DCP_METADATA} entry"), f"{DCP_METADATA} entry")
        except NxdError as exc:
            return f"{os.path.join(path, DCP_METADATA)}: {exc}"
        end, index = needed[name]
        size = os.path.getsize(where) if os.path.isfile(where) else None
        if size is None or size < end:
            what = "missing" if size is None else f"truncated: it has {size} bytes"
            return (f"{where}: {what}, and {DCP_METADATA} places {getattr(index, 'fqn', index)!r} up to byte {end}; "
                    "the checkpoint is damaged: restore that file")
    return None


def verify_dcp(path: str) -> None:
    """Check the DCP folder ``path`` before any tensor of it is used (collective when a process group
    is up: the ranks share the files): nxd's checksums when it has them, else its layout, with a note."""
    if not os.path.isfile(os.path.join(path, DCP_METADATA)):
        raise DcpCheckpointError(f"{path} is not a complete DCP checkpoint (no {DCP_METADATA}); give the folder "
                                 "a completed save wrote")
    files = read_manifest(path)
    if files is None:
        if not dist.is_initialized() or dist.get_rank() == 0:
            warnings.warn(f"{path}: no {MANIFEST} (a DCP folder written by torchtitan or torch, not nxd): loading it "
                          "unverified", UserWarning, stacklevel=3)
        _agree(_check_layout(path))
        return
    _agree(_verify_manifest(path, files))


def load_error(path: str, exc: BaseException) -> DcpCheckpointError:
    """One line for a DCP read that failed after the checks (torch's exception text, with its advice, stays out)."""
    failures = exc.failures if isinstance(exc, CheckpointException) else {0: (exc, None)}
    rank, (cause, _) = min(failures.items())
    first = str(cause).strip().splitlines()[0] if str(cause).strip() else ""
    detail = "" if "weights_only" in str(cause) else f": {first[:200]}"
    return DcpCheckpointError(f"DCP checkpoint {path}: rank {rank} could not read it ({type(cause).__name__}{detail}); "
                              "its files do not hold what its .metadata describes (swapped, truncated or altered); "
                              f"it has no {MANIFEST} to say which file. Restore the folder")
