"""A DCP file read and hashed in one pass: the bytes DCP reads are hashed, in file order, on a
helper thread while DCP copies the tensor out; the few bytes it skips (zip headers read out of
order, other ranks' items) are read and hashed to complete the file's CRC-32.

The memory torch reads a tensor's bytes into belongs to the tensor ``torch.load`` returns: it is
hashed only once that tensor is in hand (:meth:`VerifyingFile.settle`), and held until the hash is
done (:meth:`VerifyingFile.wait`). Bytes read into memory no returned tensor owns (a stream
transform's buffer) are not trusted to hold still: the file is then hashed by a second read at the
end, so a digest is never taken of memory that may be gone.
"""

from __future__ import annotations

import io
import os
from concurrent.futures import Future
from typing import Any, BinaryIO

import torch

from nxd_core_parallel.file_checksums import ALGORITHM, check_digest, crc32, file_digest
from nxd_core_parallel.hashing_writer import LARGE_WRITE, address_of, hash_pool

_GAP_CHUNK = 8 << 20
#: a file is checked as it is read: its bytes may be in the model when the check fails
STOPPED = "the load stopped there (parameters it had filled are not to be used)"


class VerifyingFile(io.RawIOBase):
    """The file ``where`` (``size`` bytes) for DCP's seeks and reads, hashing what is read (when
    ``hashing``; else only served)."""

    def __init__(self, raw: BinaryIO, size: int, where: str, hashing: bool = True) -> None:
        super().__init__()
        self._raw, self._size, self.where, self._hashing = raw, size, where, hashing
        self._next = 0  #: bytes [0, _next) are queued for hashing, in file order
        self._pieces: list[Any] = []  #: queued since the last settle: bytes, or memoryviews of torch's memory
        self._regions: list[memoryview] = []  #: those memoryviews, to check against the tensor read
        self._crc = 0
        self._future: Future | None = None
        self._unsure = False  #: bytes went to memory nobody holds: hash the file by reading it again

    # -- the file DCP reads
    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        return self._raw.seek(offset, whence)

    def tell(self) -> int:
        return self._raw.tell()

    def readinto(self, b: Any) -> int:
        start = self._raw.tell()
        n = self._raw.readinto(b)
        if self._hashing and n:
            self._saw(start, memoryview(b).cast("B")[:n], owned=False)
        return n

    def read(self, size: int = -1) -> bytes:
        start = self._raw.tell()
        data = self._raw.read(size)
        if self._hashing and data:
            self._saw(start, memoryview(data), owned=True)
        return data

    # -- hashing in file order
    def _saw(self, start: int, view: memoryview, owned: bool) -> None:
        end = start + view.nbytes
        if end <= self._next:
            return
        if start > self._next:
            if view.nbytes < LARGE_WRITE:  # a header read out of order: hashed when the cursor reaches it
                return
            self._fill(start)
        piece = view[self._next - start:]
        if owned:
            self._pieces.append(piece)
        elif piece.nbytes < LARGE_WRITE:
            self._pieces.append(bytes(piece))
        else:
            self._pieces.append(piece)
            self._regions.append(piece)
        self._next = end

    def _fill(self, upto: int) -> None:
        """Read and queue the bytes [_next, upto) nobody read."""
        while self._next < upto:
            chunk = os.pread(self._raw.fileno(), min(_GAP_CHUNK, upto - self._next), self._next)
            if not chunk:
                break
            self._pieces.append(chunk)
            self._next += len(chunk)

    def _hash(self, pieces: list[Any]) -> None:
        for piece in pieces:
            self._crc = crc32(piece, self._crc)

    def settle(self, tensor: torch.Tensor | None) -> None:
        """Start hashing what was read since the last call; ``tensor``: what ``torch.load`` returned
        from it (it must own the memory its bytes were read into). Call :meth:`wait` before dropping it."""
        if not self._hashing or not self._pieces:
            return
        if self._regions:
            storage = tensor.untyped_storage() if tensor is not None and tensor.device.type == "cpu" else None
            lo = storage.data_ptr() if storage is not None else 0
            hi = lo + storage.nbytes() if storage is not None else 0
            if not all(lo <= address_of(r) and address_of(r) + r.nbytes <= hi for r in self._regions):
                self._unsure = True
        pieces, self._pieces, self._regions = self._pieces, [], []
        if self._unsure:
            return
        self._future = hash_pool().submit(self._hash, pieces)

    def wait(self) -> None:
        if self._future is not None:
            self._future.result()
            self._future = None

    def finish(self, recorded: dict[str, Any], others: dict[str, dict]) -> None:
        """Hash the rest of the file and compare with ``recorded`` (raises naming the file)."""
        self._fill(self._size)
        self.settle(None)
        self.wait()
        actual = file_digest(self.where) if self._unsure else {"bytes": self._next, ALGORITHM: f"{self._crc:08x}"}
        check_digest(actual, recorded, self.where, "nxd saved it", others, STOPPED)

    def check_after_failure(self, recorded: dict[str, Any], others: dict[str, dict]) -> None:
        """A read failed part way: say so naming the file if the file is not what nxd saved."""
        self.wait()
        self._pieces, self._regions = [], []
        check_digest(file_digest(self.where), recorded, self.where, "nxd saved it", others, STOPPED)
