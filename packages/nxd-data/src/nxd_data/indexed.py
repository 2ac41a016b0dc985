"""Megatron ``MMapIndexedDataset`` files: ``<prefix>.bin`` (tokens) + ``<prefix>.idx`` (index).

The layout is Megatron-LM's / NeMo's (``data_impl: mmap``), so datasets prepared here load there
and theirs load here:

``.idx`` = ``b"MMIDIDX\\x00\\x00"``, ``<Q`` version 1, ``<B`` dtype code, ``<Q`` sequence count,
``<Q`` document count, then ``int32 sizes[n]``, ``int64 pointers[n]`` (byte offsets into ``.bin``),
``int64 doc_idx[m]``. Each prepared document is one sequence.

Token dtype: ``uint16`` (code 8) when every id fits (vocab <= 65536), else ``int32`` (code 4):
the format has no ``uint32`` code, and int32 holds any real vocabulary.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from nxd.errors import ConfigError

MAGIC = b"MMIDIDX\x00\x00"
DTYPES: dict[int, type] = {
    1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32, 8: np.uint16,
}
CODES = {np.dtype(v): k for k, v in DTYPES.items()}


def dtype_for_vocab(vocab_size: int, requested: str = "auto") -> np.dtype:
    """Token dtype for ``vocab_size``; a requested dtype too small for it is an error."""
    if vocab_size <= 0:
        raise ConfigError(f"vocab_size must be positive, got {vocab_size}")
    if requested == "auto":
        return np.dtype(np.uint16 if vocab_size <= 65536 else np.int32)
    try:
        dtype = np.dtype(requested)
    except TypeError:
        raise ConfigError(f"dtype={requested!r} is not a numpy dtype; valid: auto, uint16, int32") from None
    if dtype not in (np.dtype(np.uint16), np.dtype(np.int32)):
        raise ConfigError(f"dtype={requested!r}: token files use auto, uint16 or int32")
    limit = int(np.iinfo(dtype).max) + 1
    if vocab_size > limit:
        raise ConfigError(
            f"vocab_size={vocab_size} does not fit dtype {dtype.name} (at most {limit} ids); use --dtype int32 or auto"
        )
    return dtype


def paths(prefix: str | Path) -> tuple[Path, Path]:
    prefix = str(prefix)
    return Path(prefix + ".bin"), Path(prefix + ".idx")


class IndexedDatasetWriter:
    """Appends documents to ``bin_path`` and writes the index at :meth:`finish`."""

    def __init__(self, bin_path: str | Path, idx_path: str | Path, dtype: np.dtype) -> None:
        self.bin_path, self.idx_path, self.dtype = Path(bin_path), Path(idx_path), np.dtype(dtype)
        self._max = int(np.iinfo(self.dtype).max)
        self._bin = open(self.bin_path, "wb")
        self.sizes: list[int] = []
        self.num_tokens = 0

    def add(self, tokens: np.ndarray) -> None:
        arr = np.asarray(tokens)
        if arr.size and (int(arr.max()) > self._max or int(arr.min()) < 0):
            raise ConfigError(
                f"token id {int(arr.max())} does not fit the dataset dtype {self.dtype.name}; "
                "the tokenizer's vocabulary is larger than its reported vocab_size (use --dtype int32)"
            )
        self._bin.write(arr.astype(self.dtype, copy=False).tobytes(order="C"))
        self.sizes.append(int(arr.size))
        self.num_tokens += int(arr.size)

    def finish(self) -> None:
        self._bin.close()
        sizes = np.asarray(self.sizes, dtype=np.int32)
        pointers = np.zeros(len(sizes), dtype=np.int64)
        if len(sizes) > 1:
            np.cumsum(sizes[:-1].astype(np.int64) * self.dtype.itemsize, out=pointers[1:])
        doc_idx = np.arange(len(sizes) + 1, dtype=np.int64)
        with open(self.idx_path, "wb") as fh:
            fh.write(MAGIC)
            fh.write(struct.pack("<Q", 1))
            fh.write(struct.pack("<B", CODES[self.dtype]))
            fh.write(struct.pack("<Q", len(sizes)))
            fh.write(struct.pack("<Q", len(doc_idx)))
            fh.write(sizes.tobytes(order="C"))
            fh.write(pointers.tobytes(order="C"))
            fh.write(doc_idx.tobytes(order="C"))

    def abort(self) -> None:
        if not self._bin.closed:
            self._bin.close()


class IndexedDataset:
    """Read-only memory-mapped view of ``<prefix>.bin/.idx``; ``ds[i]`` is document ``i``'s tokens."""

    def __init__(self, prefix: str | Path) -> None:
        self.prefix = str(prefix)
        bin_path, idx_path = paths(prefix)
        for p in (bin_path, idx_path):
            if not p.is_file():
                raise ConfigError(f"indexed dataset file {p} does not exist (data_prefix={self.prefix!r})")
        with open(idx_path, "rb") as fh:
            if fh.read(9) != MAGIC:
                raise ConfigError(f"{idx_path} is not a Megatron mmap index (bad magic)")
            (version,) = struct.unpack("<Q", fh.read(8))
            if version != 1:
                raise ConfigError(f"{idx_path}: index version {version} is not supported (only 1)")
            (code,) = struct.unpack("<B", fh.read(1))
            if code not in DTYPES:
                raise ConfigError(f"{idx_path}: unknown dtype code {code}")
            self.dtype = np.dtype(DTYPES[code])
            (n,) = struct.unpack("<Q", fh.read(8))
            (m,) = struct.unpack("<Q", fh.read(8))
            offset = fh.tell()
        index = np.memmap(idx_path, mode="r", dtype=np.uint8)
        self.sizes = np.frombuffer(index, dtype=np.int32, count=n, offset=offset)
        self.pointers = np.frombuffer(index, dtype=np.int64, count=n, offset=offset + 4 * n)
        self.doc_idx = np.frombuffer(index, dtype=np.int64, count=m, offset=offset + 12 * n)
        expected = int(self.sizes.astype(np.int64).sum()) * self.dtype.itemsize
        if bin_path.stat().st_size != expected:
            raise ConfigError(
                f"{bin_path} has {bin_path.stat().st_size} bytes but its index describes {expected}: "
                "the .bin and .idx files do not belong together"
            )
        self.tokens = (
            np.memmap(bin_path, mode="r", dtype=self.dtype) if expected else np.zeros(0, dtype=self.dtype)
        )
        self._starts = self.pointers // self.dtype.itemsize

    def __len__(self) -> int:
        return len(self.sizes)

    @property
    def num_tokens(self) -> int:
        return int(self.sizes.astype(np.int64).sum())

    def __getitem__(self, i: int) -> np.ndarray:
        start = int(self._starts[i])
        return self.tokens[start : start + int(self.sizes[i])]

    def get(self, i: int, offset: int = 0, length: int | None = None) -> np.ndarray:
        """``length`` tokens of document ``i`` from ``offset`` (to its end when ``None``)."""
        start = int(self._starts[i]) + offset
        end = int(self._starts[i]) + int(self.sizes[i]) if length is None else start + length
        return self.tokens[start:end]
