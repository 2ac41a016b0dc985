"""Content checksums: computed on the bytes as they stream out at save, recorded in
``metadata.json`` (and the metadata's own in ``done``), verified on load.

CRC-32 catches flipped bytes, truncation and swapped files, which is what it is for (not an
adversary: a tampered checkpoint can carry a matching checksum). zlib-ng computes the same CRC-32
as the standard library's zlib about 4x faster (5.4 vs 1.4 GB/s of CPU time measured here), and
both release the GIL on large buffers: a large write is hashed on the calling thread while a
helper thread hands the same bytes to the file, so hashing costs no wall time when the disk is
the slower of the two.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, BinaryIO

try:
    from zlib_ng.zlib_ng import crc32
except ImportError:  # the same checksum, slower
    from zlib import crc32

from nxd_ckpt.errors import CorruptCheckpointError

ALGORITHM = "crc32"
#: writes at least this large are hashed and written at the same time (smaller: one after the other)
OVERLAP_BYTES = 1 << 20
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _forget_pool() -> None:  # a forked child has no worker thread: start a new pool there
    global _pool
    _pool = None


os.register_at_fork(after_in_child=_forget_pool)


def _file_writer_pool() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nxd-ckpt-file-write")
        return _pool


class HashingWriter:
    """A write-only binary file that forwards every byte to ``f`` and hashes and counts it on the
    way. An OSError from ``f`` is kept (``error``) so a caller whose library turns it into an
    unclear message (torch.save: ``unexpected pos``) can report the real cause."""

    def __init__(self, f: BinaryIO) -> None:
        self._f = f
        self._crc = 0
        self.nbytes = 0
        self.error: OSError | None = None

    def write(self, data: Any) -> int:
        view = memoryview(data)
        if view.ndim != 1 or view.format != "B":
            view = view.cast("B")
        try:
            if view.nbytes >= OVERLAP_BYTES:
                # the bytes stay valid until both are done: the caller's buffer outlives this call
                pending = _file_writer_pool().submit(self._f.write, view)
                try:
                    self._crc = crc32(view, self._crc)
                finally:
                    pending.result()
            else:
                self._f.write(view)
                self._crc = crc32(view, self._crc)
        except OSError as exc:
            self.error = exc
            raise
        self.nbytes += view.nbytes
        return view.nbytes

    def flush(self) -> None:
        self._f.flush()

    def tell(self) -> int:
        return self.nbytes

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def readable(self) -> bool:
        return False

    def digest(self) -> dict[str, Any]:
        return {"bytes": self.nbytes, ALGORITHM: f"{self._crc:08x}"}


def digest_of(data: bytes | memoryview) -> dict[str, Any]:
    return {"bytes": len(data), ALGORITHM: f"{crc32(data):08x}"}


def verify(data: bytes, recorded: dict[str, Any], where: str, others: dict[str, dict] | None = None) -> None:
    """Raise :class:`CorruptCheckpointError` naming ``where`` unless ``data`` matches ``recorded``;
    ``others`` (path -> recorded digest) lets the message say which file the bytes really are."""
    actual = digest_of(data)
    if actual == {k: recorded.get(k) for k in actual}:
        return
    hint = ""
    swapped = [p for p, d in (others or {}).items() if d == actual]
    if swapped:
        hint = f"; its content is that of {swapped[0]} (files swapped or copied over each other?)"
    elif actual["bytes"] != recorded.get("bytes"):
        hint = f"; it has {actual['bytes']} bytes, {recorded.get('bytes')} were written (truncated or replaced?)"
    raise CorruptCheckpointError(
        f"{where}: content checksum mismatch ({ALGORITHM} {actual[ALGORITHM]}, recorded at save "
        f"{recorded.get(ALGORITHM)}): the file was corrupted or altered after it was saved{hint}"
    )
