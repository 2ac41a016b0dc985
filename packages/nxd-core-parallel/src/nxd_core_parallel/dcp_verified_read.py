"""A DCP file read and hashed in one pass: the bytes DCP reads are hashed, in file order, as they
are read; the few bytes it skips (zip headers read out of order, other ranks' items) are read and
hashed to complete the file's CRC-32.

A tensor's bytes (one ``readinto`` of the whole storage by ``torch.load``) are read in
:data:`READ_CHUNK` pieces; each piece is hashed on the helper thread while the next one is read, and
``readinto`` returns only once every piece of its buffer is hashed. So the hash runs beside the read
(the slower of the two: a page-cache read costs ~4x CRC-32's CPU time here), over bytes still in the
CPU's cache, and never over memory after the call that lent it returned. Small reads are copied.
Measured here (bench_ckpt.py --dcp-only): hashing a whole item after ``torch.load`` returned it, from
memory, cost more, and overlapped only with DCP's copy into the model.
"""

from __future__ import annotations

import io
import os
from concurrent.futures import Future
from typing import Any, BinaryIO

from nxd_core_parallel.file_checksums import ALGORITHM, check_digest, crc32, file_digest
from nxd_core_parallel.hashing_writer import LARGE_WRITE, hash_pool

_GAP_CHUNK = 8 << 20
#: a large read is read and hashed in pieces of this size (in the CPU's cache when hashed)
READ_CHUNK = 4 << 20
#: a file is checked as it is read: its bytes may be in the model when the check fails
STOPPED = "the load stopped there (parameters it had filled are not to be used)"


class VerifyingFile(io.RawIOBase):
    """The file ``where`` (``size`` bytes) for DCP's seeks and reads, hashing what is read (when
    ``hashing``; else only served)."""

    def __init__(self, raw: BinaryIO, size: int, where: str, hashing: bool = True) -> None:
        super().__init__()
        self._raw, self._size, self.where, self._hashing = raw, size, where, hashing
        self._next = 0  #: bytes [0, _next) are queued for hashing, in file order
        self._pieces: list[bytes | memoryview] = []  #: queued, not yet handed to the helper: bytes this object owns
        self._crc = 0
        self._future: Future | None = None  #: the last hash handed to the helper (one worker: in order)

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
        view = memoryview(b).cast("B")
        if not self._hashing or view.nbytes < LARGE_WRITE:
            start = self._raw.tell()
            n = self._raw.readinto(view)
            if self._hashing and n:
                self._saw(start, bytes(view[:n]))
            return n
        total = 0
        try:  # read a piece, hand it to the helper, read the next while it hashes
            while total < view.nbytes:
                start = self._raw.tell()
                n = self._raw.readinto(view[total:total + READ_CHUNK])
                if not n:
                    break
                self._saw(start, view[total:total + n])
                self._submit()
                total += n
        finally:
            self.wait()  # ``b`` is the caller's: hashed before it is handed back
        return total

    def read(self, size: int = -1) -> bytes:
        start = self._raw.tell()
        data = self._raw.read(size)
        if self._hashing and data:
            self._saw(start, memoryview(data))
        return data

    # -- hashing in file order
    def _saw(self, start: int, piece: bytes | memoryview) -> None:
        """Queue the bytes of ``piece`` (read at ``start``) that come next in file order."""
        view = memoryview(piece)
        end = start + view.nbytes
        if end <= self._next:
            return
        if start > self._next:
            if view.nbytes < LARGE_WRITE:  # a header read out of order: hashed when the cursor reaches it
                return
            self._fill(start)
        self._pieces.append(view[self._next - start:])
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

    def _submit(self) -> None:
        """Hand what is queued to the helper thread."""
        if self._pieces:
            pieces, self._pieces = self._pieces, []
            self._future = hash_pool().submit(self._hash, pieces)

    def wait(self) -> None:
        """Wait until everything handed to the helper is hashed."""
        if self._future is not None:
            try:
                self._future.result()
            finally:
                self._future = None

    def finish(self, recorded: dict[str, Any], others: dict[str, dict]) -> None:
        """Hash the rest of the file and compare with ``recorded`` (raises naming the file)."""
        self._fill(self._size)
        self.wait()
        self._hash(self._pieces)
        self._pieces = []
        check_digest({"bytes": self._next, ALGORITHM: f"{self._crc:08x}"}, recorded, self.where, "nxd saved it",
                     others, STOPPED)

    def check_after_failure(self, recorded: dict[str, Any], others: dict[str, dict]) -> None:
        """A read failed part way: say so naming the file if the file is not what nxd saved."""
        self.wait()
        self._pieces = []
        check_digest(file_digest(self.where), recorded, self.where, "nxd saved it", others, STOPPED)
