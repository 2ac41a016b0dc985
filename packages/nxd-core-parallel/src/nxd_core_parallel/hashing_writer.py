"""A file writer that hashes (CRC-32) every byte it forwards, without a second read of the file.

The one implementation behind nxd-ckpt's own checkpoint files and nxd-fsdp's DCP files. Bytes of
memory the saver holds still until the file is finished (its tensors: :class:`StableMemory`) are
only remembered while they are written and hashed on a helper thread while the file is flushed and
synced (:meth:`HashingWriter.hash_in_background`): measured here, hashing at the same time as
writing slowed the writes more than it saved, while hashing during the fsync is free. Anything else
is hashed before ``write`` returns (its caller may reuse the buffer): small writes are copied, large
ones hashed at once. zlib-ng and zlib release the GIL on large buffers.
"""

from __future__ import annotations

import bisect
import math
import os
import threading
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, BinaryIO

import numpy as np
import torch

from nxd_core_parallel.file_checksums import ALGORITHM, crc32

__all__ = ["LARGE_WRITE", "HashingWriter", "StableMemory", "WriteOnlyFile", "hash_pool", "stable_regions"]

#: a write of memory that may not hold still is copied below this size, hashed at once above it
LARGE_WRITE = 1 << 20
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _forget_pool() -> None:  # a forked child has no worker thread: start a new pool there
    global _pool
    _pool = None


os.register_at_fork(after_in_child=_forget_pool)


def hash_pool() -> ThreadPoolExecutor:
    """The one helper thread that hashes in the background (one worker: pieces hash in order)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nxd-hash")
        return _pool


def address_of(view: memoryview) -> int:
    return np.frombuffer(view, dtype=np.uint8).ctypes.data if view.nbytes else 0


def stable_regions(obj: Any) -> list[tuple[int, int]]:
    """The memory (start, end) of every host tensor storage in ``obj`` (nested dicts, lists,
    tuples): bytes a writer of ``obj`` may hash after the write returns, as the saver holds ``obj``
    unchanged until the file is finished."""
    regions: list[tuple[int, int]] = []
    stack = [obj]
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            if item.device.type == "cpu":
                storage = item.untyped_storage()
                regions.append((storage.data_ptr(), storage.data_ptr() + storage.nbytes()))
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return sorted(regions)


class StableMemory:
    """Host memory that holds still until the files written from it are hashed: regions the saver
    vouches for, and tensors added while writing (:meth:`hold` keeps a reference, so they do)."""

    def __init__(self, regions: Iterable[tuple[int, int]] = ()) -> None:
        self._regions = sorted(regions)
        self._held: list[torch.Tensor] = []
        self._lock = threading.Lock()  # DCP may write with several threads

    def hold(self, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        with self._lock:
            self._held.append(tensor)
            bisect.insort(self._regions, (storage.data_ptr(), storage.data_ptr() + storage.nbytes()))

    def holds(self, view: memoryview) -> bool:
        if not self._regions or not view.nbytes:
            return False
        start = address_of(view)
        with self._lock:
            i = bisect.bisect_right(self._regions, (start, math.inf)) - 1  # the last region starting at or before it
            return i >= 0 and start + view.nbytes <= self._regions[i][1]

    def release(self) -> None:
        with self._lock:
            self._held.clear()


class WriteOnlyFile:
    """What a forward-only binary file answers to the libraries writing through it (torch.save, DCP):
    writable, neither seekable nor readable. The base of nxd's hashing file wrappers."""

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def readable(self) -> bool:
        return False


class HashingWriter(WriteOnlyFile):
    """A write-only binary file that forwards every byte to ``f`` and hashes and counts it.

    ``stable``: memory that holds still until :meth:`digest` (:class:`StableMemory`, or regions from
    :func:`stable_regions`); writes from it are hashed after the last write, while the file is
    flushed (:meth:`hash_in_background`, then :meth:`digest`). An OSError from ``f`` is kept
    (``error``) so a caller whose library turns it into an unclear message (torch.save: ``unexpected
    pos``) can report the real cause."""

    def __init__(self, f: BinaryIO, stable: StableMemory | Iterable[tuple[int, int]] = ()) -> None:
        self._f = f
        self._crc = 0
        #: what is written but not hashed yet, in order: views of stable memory, copies of small writes
        self._unhashed: list[Any] = []
        self._hashing: Future | None = None
        self._stable = stable if isinstance(stable, StableMemory) else StableMemory(stable)
        self.nbytes = 0
        self.error: OSError | None = None

    def _hash_unhashed(self) -> None:
        for piece in self._unhashed:
            self._crc = crc32(piece, self._crc)
        self._unhashed = []

    def write(self, data: Any) -> int:
        if self._hashing is not None:
            raise ValueError("HashingWriter: write after hash_in_background()")
        view = memoryview(data)
        if view.ndim != 1 or view.format != "B":
            view = view.cast("B")
        try:
            self._f.write(view)
        except OSError as exc:
            self.error = exc
            raise
        if self._stable.holds(view):
            self._unhashed.append(view)
        elif view.nbytes < LARGE_WRITE:  # zip headers, pickles: copied, a few bytes each
            if not self._unhashed or not isinstance(self._unhashed[-1], bytearray):
                self._unhashed.append(bytearray())
            self._unhashed[-1] += view
        else:
            self._hash_unhashed()
            self._crc = crc32(view, self._crc)
        self.nbytes += view.nbytes
        return view.nbytes

    def hash_in_background(self) -> None:
        """Start hashing what is left on a helper thread (call after the last write, before the
        file is flushed and synced, which then happens at the same time)."""
        if self._hashing is None and sum(len(piece) for piece in self._unhashed) >= LARGE_WRITE:
            try:
                self._hashing = hash_pool().submit(self._hash_unhashed)
            except RuntimeError:  # interpreter shutdown (an async save finishing at exit): digest() hashes
                pass

    def flush(self) -> None:
        self._f.flush()

    def tell(self) -> int:
        return self.nbytes

    def digest(self) -> dict[str, Any]:
        """The checksum of everything written."""
        if self._hashing is not None:
            self._hashing.result()
        self._hash_unhashed()
        return {"bytes": self.nbytes, ALGORITHM: f"{self._crc:08x}"}
