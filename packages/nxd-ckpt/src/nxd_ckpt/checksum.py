"""Content checksums: computed on the bytes as they stream out at save, recorded in
``metadata.json`` (and the metadata's own in ``done``), verified on load.

CRC-32 (zlib, in the standard library) hashes at several GB/s and releases the GIL on large
buffers, so an asynchronous writer thread hashing what it writes costs the training thread nothing;
it catches flipped bytes, truncation and swapped files, which is what it is for (not an
adversary: a tampered checkpoint can carry a matching checksum).
"""

from __future__ import annotations

import zlib
from typing import Any, BinaryIO

from nxd_ckpt.errors import CorruptCheckpointError

ALGORITHM = "crc32"


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
            self._f.write(view)
        except OSError as exc:
            self.error = exc
            raise
        self._crc = zlib.crc32(view, self._crc)
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
    return {"bytes": len(data), ALGORITHM: f"{zlib.crc32(data):08x}"}


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
