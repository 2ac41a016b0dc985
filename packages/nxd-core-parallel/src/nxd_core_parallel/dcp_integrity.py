"""Integrity of torch.distributed.checkpoint (DCP) folders: nxd's checksums, and errors that name files.
Used by nxd-fsdp's ``save_dcp``/``load_dcp`` and nxd-compat's NxD ZeRO-1 DCP writer/reader
(``neuronx_distributed.optimizer.zero_dcp_utils``).

``save_dcp`` writes every file through nxd's one hashing writer (``nxd_core_parallel.hashing_writer``:
CRC-32, no second read; the tensors' bytes are hashed while the file is synced), and rank 0 records
all ranks' digests in ``nxd_checksums.json`` before the folder is renamed into place (DCP's readers
ignore the file). ``load_dcp`` has each rank hash every file it reads as it reads it (one pass,
``nxd_core_parallel.dcp_verified_read``: :class:`SafeReader`) and raise, naming the file, before the load returns: a damaged
file's bytes may reach the model's parameters, but the load never completes with them. Files no rank
reads are not read at all. A folder without the manifest (torchtitan's, torch's own) is loaded with
a one-line note that it is unverified, each file checked to hold the bytes its ``.metadata`` places
in it.

``.metadata`` is a pickle: it is read by nxd's one restricted unpickler
(``nxd_core_parallel.dcp_metadata``: DCP's metadata classes, ``torch.Size``, dtypes and paths only;
torch's reader unpickles anything, code included).
"""

from __future__ import annotations

import errno
import io
import os
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.filesystem import FileSystem
from torch.distributed.checkpoint.planner import LoadItemType
from torch.futures import Future

from nxd.errors import NxdError
from nxd.paths import check_relative, resolve_inside
from nxd_core_parallel.dcp_metadata import DcpMetadataError, load_dcp_metadata
from nxd_core_parallel.dcp_verified_read import VerifyingFile
from nxd_core_parallel.file_checksums import (
    MANIFEST,
    check_digest,
    digest_of,
    read_manifest,
    write_manifest,
)
from nxd_core_parallel.hashing_writer import HashingWriter, StableMemory, WriteOnlyFile

DCP_METADATA = ".metadata"


class DcpCheckpointError(NxdError, RuntimeError):
    """A DCP checkpoint could not be written or read; the message names the folder and file."""


# ---------------------------------------------------------------------------------------------- save
class _DigestingStream(WriteOnlyFile):
    """A file DCP writes, through nxd's one hashing writer (``nxd_core_parallel.hashing_writer``); an
    OSError names the file. The tensors' bytes are hashed while DCP syncs the file: DCP asks for
    ``fileno()`` to fsync right after its last write, which is when the hashing starts."""

    def __init__(self, raw: Any, fs: _DigestingFileSystem, path: Path) -> None:
        self._raw, self._fs, self._path = raw, fs, path
        self._out = HashingWriter(raw, stable=fs.stable)
        self._recorded = False

    def write(self, data: Any) -> int:
        try:
            return self._out.write(data)
        except OSError as exc:  # the kernel's ENOSPC names no file: say which (it reaches every rank's error)
            raise OSError(exc.errno, f"{exc.strerror or exc} (writing {self._path})") from None

    def tell(self) -> int:
        return self._out.tell()

    def flush(self) -> None:
        self._raw.flush()

    def fileno(self) -> int:
        self._out.hash_in_background()  # DCP's fsync follows: hash meanwhile
        return self._raw.fileno()

    @property
    def closed(self) -> bool:
        return self._raw.closed

    def record(self) -> None:
        if not self._recorded:
            self._recorded = True
            self._fs.record(self._path.name.removesuffix(".tmp"), self._out.digest())  # .metadata.tmp is renamed

    def close(self) -> None:
        self._raw.close()
        self.record()


class _DigestingFileSystem(FileSystem):
    def __init__(self) -> None:
        super().__init__()
        self.digests: dict[str, dict] = {}
        self.stable = StableMemory()  # the tensors being written, held until their files are hashed
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


class _HoldingPlanner:
    """DCP's save planner, handing out host tensors that hold still until their file is hashed: each
    is made compact here (as DCP's writer would copy it anyway) and held by the writer."""

    def __init__(self, planner: Any, stable: StableMemory) -> None:
        self._planner, self._stable = planner, stable

    def resolve_data(self, item: Any) -> Any:
        data = self._planner.resolve_data(item)
        if isinstance(data, torch.Tensor) and data.device.type == "cpu":
            data = data.detach()
            if data.untyped_storage().nbytes() != data.nbytes:
                data = data.clone()
            self._stable.hold(data)
        return data

    def __getattr__(self, name: str) -> Any:
        return getattr(self._planner, name)


class DigestingWriter(FileSystemWriter):
    """DCP's file writer, recording the CRC-32 of every file it writes (``self.fs.digests``)."""

    def __init__(self, path: str | os.PathLike, **kwargs: Any) -> None:
        super().__init__(path, **kwargs)
        self.fs = _DigestingFileSystem()

    def write_data(self, plan: Any, planner: Any) -> Any:
        try:
            return super().write_data(plan, _HoldingPlanner(planner, self.fs.stable))
        finally:
            self.fs.stable.release()  # every file is closed, so hashed


def save_error(path: str, exc: BaseException) -> DcpCheckpointError:
    """One line for a failed DCP save: the rank, the file and the cause (``no space left``)."""
    failures = exc.failures if isinstance(exc, CheckpointException) else {dist.get_rank() if dist.is_initialized()
                                                                           else 0: (exc, None)}
    rank, (cause, _) = min(failures.items())
    full = isinstance(cause, OSError) and cause.errno == errno.ENOSPC
    why = f"no space left on device: {cause.strerror}" if full else f"{type(cause).__name__}: {cause}"
    return DcpCheckpointError(f"DCP save to {path} failed on rank {rank}: {why}. Nothing was saved at {path} (the "
                              f"partial files are in {path}.partial: remove them); free space or save elsewhere")


def record_manifest(partial: str, writer: DigestingWriter, by: str) -> None:
    """Gather every rank's digests; rank 0 writes them into ``partial`` (``by``: the writer's name, as the
    manifest records it). Collective; raises on every rank if rank 0 could not write the manifest."""
    gathered: list[Any] = [None] * dist.get_world_size() if dist.is_initialized() else [None]
    if dist.is_initialized():
        dist.all_gather_object(gathered, writer.fs.digests)
    else:
        gathered = [writer.fs.digests]
    failure = [None]
    if not dist.is_initialized() or dist.get_rank() == 0:
        merged = {name: d for digests in gathered for name, d in digests.items()}
        try:
            write_manifest(partial, merged, by)
        except OSError as exc:
            full = exc.errno == errno.ENOSPC
            failure[0] = (f"writing {os.path.join(partial, MANIFEST)} failed: "
                          f"{'no space left on device' if full else exc}; nothing was saved (free space or save elsewhere)")
    if dist.is_initialized():
        dist.broadcast_object_list(failure, src=0)
    if failure[0]:
        raise DcpCheckpointError(failure[0])


# ---------------------------------------------------------------------------------------------- load
def read_metadata(path: str, files: dict[str, dict] | None = None) -> Any:
    """DCP's ``.metadata`` of the folder ``path``, checked against ``files`` (nxd's manifest) when
    given, and read safely; errors name the file."""
    where = os.path.join(path, DCP_METADATA)
    with open(where, "rb") as f:
        data = f.read()
    if files is not None:
        check_digest(digest_of(data), files.get(DCP_METADATA, {}), where, "nxd saved it")
    try:
        return load_dcp_metadata(data, where)
    except DcpMetadataError as exc:
        raise DcpCheckpointError(str(exc)) from None


class SafeReader(FileSystemReader):
    """DCP's file reader that checks each file this rank reads as it reads it (one pass,
    :class:`~nxd_core_parallel.dcp_verified_read.VerifyingFile`): against nxd's manifest (``files``) when the
    folder has one, else only that it holds the bytes ``.metadata`` places in it. A file that fails
    its check raises before the load returns, naming the file. ``.metadata`` goes through
    :func:`read_metadata` (checked, safe unpickler). The read loop is DCP's own (torch 2.13's
    ``FileSystemReader.read_data``), with the items of a file read in file order."""

    def __init__(self, path: str | os.PathLike, files: dict[str, dict] | None = None) -> None:
        super().__init__(path)
        self._files = files

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        from torch.distributed.checkpoint.metadata import StorageMeta

        meta = read_metadata(str(self.path), self._files)
        if getattr(meta, "storage_meta", None) is None:
            meta.storage_meta = StorageMeta()
        meta.storage_meta.load_id = self.load_id
        return meta

    def _checked_path(self, name: str, end: int, fqn: Any) -> tuple[str, int]:
        folder = str(self.path)
        where = resolve_inside(folder, check_relative(name, f"{DCP_METADATA} entry"), f"{DCP_METADATA} entry")
        size = os.path.getsize(where) if os.path.isfile(where) else None
        if size is None or size < end:
            what = "missing" if size is None else f"truncated: it has {size} bytes"
            raise DcpCheckpointError(f"{where}: {what}, and {DCP_METADATA} places {fqn!r} up to byte {end}; the "
                                     "checkpoint is damaged: restore that file")
        if self._files is not None and name not in self._files:
            raise DcpCheckpointError(f"{where}: not among the files {MANIFEST} records (added after the save?)")
        return where, size

    def _read_item(self, stream: VerifyingFile, req: Any, planner: Any) -> None:
        info = self.storage_data[req.storage_index]
        source = self.transforms.transform_load_stream(req, info.transform_descriptors or (),
                                                       self._slice_file(stream, info))
        if req.type == LoadItemType.BYTE_IO:
            planner.load_bytes(req, io.BytesIO(source.read(-1)))
            return
        seekable = source if source.seekable() else io.BytesIO(source.read(-1))
        loaded = torch.load(seekable, map_location="cpu", weights_only=True)  # its bytes hashed as they are read
        tensor = narrow_tensor_by_index(loaded, req.storage_offsets, req.lengths)
        target = planner.resolve_tensor(req).detach()
        if target.size() != tensor.size():
            raise AssertionError(f"req {req.storage_index} mismatch sizes {target.size()} vs {tensor.size()}")
        target.copy_(tensor)
        planner.commit_tensor(req, target)

    def read_data(self, plan: Any, planner: Any) -> Any:
        per_file: dict[str, list[tuple[int, Any]]] = {}
        for item in plan.items:
            info = self.storage_data[item.storage_index]
            per_file.setdefault(info.relative_path, []).append((int(info.offset), int(info.length), item))
        for name in sorted(per_file):
            reqs = sorted(per_file[name], key=lambda r: r[0])
            end, fqn = max((o + n, getattr(r.storage_index, "fqn", r.storage_index)) for o, n, r in reqs)
            where, size = self._checked_path(name, end, fqn)
            recorded = self._files.get(name) if self._files is not None else None
            others = {os.path.join(str(self.path), n): d for n, d in (self._files or {}).items() if n != name}
            with open(where, "rb") as raw:
                stream = VerifyingFile(raw, size, where, hashing=recorded is not None)
                try:
                    for *_, req in reqs:
                        self._read_item(stream, req, planner)
                except Exception:
                    if recorded is not None:  # a damaged file names itself, not torch's parse error
                        stream.check_after_failure(recorded, others)
                    raise
                if recorded is not None:
                    stream.finish(recorded, others)
        done: Future = Future()
        done.set_result(None)
        return done


def verify_dcp(path: str) -> dict[str, dict] | None:
    """The cheap checks of the DCP folder ``path`` before a load (every rank: same files, same
    answer): it is complete, holds no ``.distcp`` its manifest does not record; returns the
    manifest (None, with a one-line note on rank 0, for a folder torchtitan or torch wrote)."""
    if not os.path.isfile(os.path.join(path, DCP_METADATA)):
        raise DcpCheckpointError(f"{path} is not a complete DCP checkpoint (no {DCP_METADATA}); give the folder "
                                 "a completed save wrote")
    files = read_manifest(path)
    if files is None:
        if not dist.is_initialized() or dist.get_rank() == 0:
            warnings.warn(f"{path}: no {MANIFEST} (a DCP folder written by torchtitan or torch, not nxd): loading it "
                          "unverified", UserWarning, stacklevel=3)
        return None
    extra = sorted(e.name for e in os.scandir(path) if e.name.endswith(".distcp") and e.name not in files)
    if extra:
        raise DcpCheckpointError(f"{os.path.join(path, extra[0])}: not among the files {MANIFEST} records (added "
                                 "after the save?)")
    return files


#: how DCP (torch 2.13) words a failed ``.metadata`` read on every rank, followed by the reader's message
_METADATA_FAILED = "global metadata read failed:"


def load_error(path: str, exc: BaseException) -> NxdError:
    """One line for a failed DCP load: nxd's own finding on the lowest failing rank as it is; any other
    exception named without its text when that carries torch's advice (``weights_only=False``)."""
    failures = exc.failures if isinstance(exc, CheckpointException) else {0: (exc, None)}
    rank, (cause, _) = min(failures.items())
    if isinstance(cause, NxdError):
        return DcpCheckpointError(str(cause))
    text = str(cause)
    if _METADATA_FAILED in text:  # DCP reports the coordinator's .metadata error inside an AssertionError
        return DcpCheckpointError(text.split(_METADATA_FAILED, 1)[1].split("; rank local metadata read failed", 1)[0]
                                  .strip())
    first = str(cause).strip().splitlines()[0] if str(cause).strip() else ""
    detail = "" if "weights_only" in str(cause) else f": {first[:200]}"
    return DcpCheckpointError(f"DCP checkpoint {path}: rank {rank} could not read it ({type(cause).__name__}{detail}); "
                              "its files do not hold what its .metadata describes (swapped or altered); it has no "
                              f"{MANIFEST} to say which file. Restore the folder")
