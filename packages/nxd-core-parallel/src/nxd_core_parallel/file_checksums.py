"""Checksums of the files of a folder nxd writes in another project's format (a Hugging Face
export, a torch.distributed.checkpoint folder), kept in ``nxd_checksums.json`` beside them, and
checked before nxd uses a byte of those files.

The other project's readers ignore the extra file; nxd's own checkpoints keep theirs in
``metadata.json`` (nxd-ckpt), computed the same way. CRC-32 catches flipped bytes, truncation and
swapped files (not an adversary). zlib-ng computes the standard CRC-32 ~4x faster than zlib.
"""

from __future__ import annotations

import json
import os
from typing import Any

try:
    from zlib_ng.zlib_ng import crc32
except ImportError:  # the same checksum, slower
    from zlib import crc32

from nxd.errors import NxdError

__all__ = ["ALGORITHM", "MANIFEST", "ChecksumError", "RunningDigest", "check_digest", "crc32", "digest_of",
           "file_digest", "read_manifest", "write_manifest"]

ALGORITHM = "crc32"
MANIFEST = "nxd_checksums.json"
_CHUNK = 8 << 20


class ChecksumError(NxdError, ValueError):
    """A file does not hold the bytes nxd wrote (or its manifest is not nxd's); the message names it."""


class RunningDigest:
    """The checksum of bytes as they stream past (written or read): no second pass over a file."""

    def __init__(self) -> None:
        self.nbytes, self._crc = 0, 0

    def update(self, data: Any) -> None:
        view = memoryview(data)
        self._crc = crc32(view, self._crc)
        self.nbytes += view.nbytes

    def digest(self) -> dict[str, Any]:
        return {"bytes": self.nbytes, ALGORITHM: f"{self._crc:08x}"}


def digest_of(data: bytes | memoryview) -> dict[str, Any]:
    running = RunningDigest()
    running.update(data)
    return running.digest()


def file_digest(path: str | os.PathLike) -> dict[str, Any]:
    running = RunningDigest()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            running.update(chunk)
    return running.digest()


def check_digest(actual: dict[str, Any], recorded: dict[str, Any], where: str, what: str = "",
                 others: dict[str, dict] | None = None, outcome: str = "nothing was loaded from it",
                 error: type[Exception] = ChecksumError) -> None:
    """Raise ``error`` (:class:`ChecksumError`, or the caller's own kind) naming ``where`` unless
    ``actual`` is ``recorded``; ``others`` (name -> recorded digest) lets the message say which file
    the bytes really are; ``outcome``: what became of the load. The one wording of a failed check."""
    if actual == {k: recorded.get(k) for k in actual}:
        return
    swapped = [p for p, d in (others or {}).items() if d == actual]
    if swapped:
        hint = f"; its content is that of {swapped[0]} (files swapped or copied over each other?)"
    elif actual["bytes"] != recorded.get("bytes"):
        hint = f"; it has {actual['bytes']} bytes, {recorded.get('bytes')} were written (truncated or replaced?)"
    else:
        hint = ""
    raise error(f"{where}: content checksum mismatch ({ALGORITHM} {actual[ALGORITHM]}, recorded when "
                        f"{what or 'nxd wrote it'} {recorded.get(ALGORITHM)}): the file was corrupted or altered "
                        f"after it was written{hint}; {outcome}. Restore or rewrite that file")


def write_manifest(folder: str | os.PathLike, files: dict[str, dict[str, Any]], writer: str) -> None:
    """Record ``files`` (name relative to ``folder`` -> digest) in ``folder/nxd_checksums.json``."""
    path = os.path.join(folder, MANIFEST)
    data = json.dumps({"writer": writer, "algorithm": ALGORITHM, "files": dict(sorted(files.items()))}, indent=1)
    with open(path, "w") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def read_manifest(folder: str | os.PathLike) -> dict[str, dict[str, Any]] | None:
    """``name -> digest`` from ``folder/nxd_checksums.json``; None when there is none."""
    path = os.path.join(folder, MANIFEST)
    if not os.path.lexists(path):
        return None
    if os.path.islink(path):
        raise ChecksumError(f"{path} is a symbolic link, not the manifest nxd writes: the folder's files cannot be "
                            "verified; remove the link (the folder then loads as unverified)")
    try:
        with open(path) as f:
            payload = json.load(f)
        files = payload["files"]
        ok = payload.get("algorithm") == ALGORITHM and isinstance(files, dict) and all(
            isinstance(d, dict) and isinstance(d.get("bytes"), int) and isinstance(d.get(ALGORITHM), str)
            for d in files.values())
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ChecksumError(f"{path}: not a checksum manifest nxd writes ({type(exc).__name__}: {exc}); remove it "
                            "to load the folder unverified") from None
    if not ok:
        raise ChecksumError(f"{path}: not a checksum manifest nxd writes (needs algorithm {ALGORITHM!r} and a "
                            "'files' object of {bytes, crc32}); remove it to load the folder unverified")
    return files
