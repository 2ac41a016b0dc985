"""Fixed-length pretraining samples over one split of an indexed dataset.

Documents of the split are put in a seeded order once and concatenated (each already ends with
EOS); sample ``k`` is the ``seq_length + 1`` tokens starting at ``k * seq_length``, so samples run
across document boundaries and overlap by one token, Megatron style. ``input_ids`` are the first
``seq_length`` tokens and ``labels`` the last ``seq_length`` (already shifted).

The document order and the sample index (``(position in order, offset)`` per sample) are cached
as ``.npy`` files in ``index_mapping_dir`` and memory-mapped on the next run.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from pathlib import Path

import numpy as np

from nxd.errors import ConfigError
from nxd_data.indexed import IndexedDataset, paths

_INDEX_VERSION = 1


def parse_splits(splits_string: str | list | tuple) -> list[float]:
    """``"980,10,10"`` (or ``/``-separated, or a list) -> three weights summing to 1."""
    if isinstance(splits_string, str):
        parts = [p for p in splits_string.replace("/", ",").split(",") if p.strip()]
    else:
        parts = list(splits_string)
    try:
        values = [float(p) for p in parts]
    except (TypeError, ValueError):
        raise ConfigError(f"splits_string={splits_string!r}: expected numbers like '980,10,10'") from None
    if not 1 <= len(values) <= 3 or any(v < 0 for v in values) or sum(values) <= 0:
        raise ConfigError(f"splits_string={splits_string!r}: give 1-3 non-negative weights with a positive sum")
    values += [0.0] * (3 - len(values))
    total = sum(values)
    return [v / total for v in values]


def split_ranges(splits_string: str | list | tuple, num_docs: int) -> list[tuple[int, int]]:
    """Document ranges of train/validation/test (Megatron's rounding: the last split absorbs drift)."""
    weights = parse_splits(splits_string)
    bounds = [0]
    for w in weights:
        bounds.append(bounds[-1] + int(round(w * num_docs)))
    drift = bounds[-1] - num_docs
    bounds = [bounds[0]] + [b - drift for b in bounds[1:]]
    bounds = [min(max(b, 0), num_docs) for b in bounds]
    return [(bounds[i], bounds[i + 1]) for i in range(3)]


class GPTSamples:
    """Samples of documents ``doc_range`` of ``dataset``: ``len()`` and ``window(i)``."""

    def __init__(
        self,
        dataset: IndexedDataset,
        doc_range: tuple[int, int],
        seq_length: int,
        seed: int,
        *,
        shuffle_docs: bool = True,
        cache_dir: str | Path | None = None,
        name: str = "train",
    ) -> None:
        self.dataset, self.seq_length, self.name = dataset, seq_length, name
        self.doc_range = doc_range
        files = None if cache_dir is None else self._cache_files(cache_dir, doc_range, seq_length, seed, shuffle_docs)
        cached = self._load(files)
        if cached is None:
            self.doc_order, self.sample_idx = self._build(doc_range, seq_length, seed, shuffle_docs)
            self._save(files)
        else:
            self.doc_order, self.sample_idx = cached
        self.num_tokens = int(dataset.sizes[doc_range[0] : doc_range[1]].astype(np.int64).sum())

    def __len__(self) -> int:
        return len(self.sample_idx)

    def window(self, i: int) -> np.ndarray:
        """The ``seq_length + 1`` tokens of sample ``i`` (int64)."""
        pos, offset = (int(v) for v in self.sample_idx[i])
        need = self.seq_length + 1
        parts = []
        while need > 0:
            doc = int(self.doc_order[pos])
            part = self.dataset.get(doc, offset, min(int(self.dataset.sizes[doc]) - offset, need))
            parts.append(part)
            need -= len(part)
            pos, offset = pos + 1, 0
        return np.concatenate(parts).astype(np.int64)

    # ------------------------------------------------------------------ index building and caching
    def _build(self, doc_range: tuple[int, int], seq: int, seed: int, shuffle: bool) -> tuple[np.ndarray, np.ndarray]:
        docs = np.arange(doc_range[0], doc_range[1], dtype=np.int64)
        if shuffle:
            docs = np.random.default_rng([seed, 0xD0C5]).permutation(docs)
        lengths = self.dataset.sizes[docs].astype(np.int64)
        cum = np.zeros(len(docs) + 1, dtype=np.int64)
        np.cumsum(lengths, out=cum[1:])
        total = int(cum[-1])
        n = max((total - 1) // seq, 0)
        starts = np.arange(n, dtype=np.int64) * seq
        pos = np.searchsorted(cum, starts, side="right") - 1
        sample_idx = np.stack([pos, starts - cum[pos]], axis=1) if n else np.zeros((0, 2), dtype=np.int64)
        return docs, sample_idx.astype(np.int64)

    def _cache_files(self, cache_dir: str | Path, doc_range: tuple[int, int], seq: int, seed: int,
                     shuffle: bool) -> tuple[Path, Path]:
        """The cached index files of these samples, named by what they are built from (the index
        file's identity included, so a rewritten dataset is never read with a stale index)."""
        idx_path = paths(self.dataset.prefix)[1]
        st = idx_path.stat()
        ident = [_INDEX_VERSION, str(idx_path.resolve()), st.st_size, st.st_mtime_ns, list(doc_range), seq, seed, shuffle]
        key = hashlib.sha1(json.dumps(ident).encode()).hexdigest()[:16]
        stem = f"{Path(self.dataset.prefix).name}_{self.name}_{key}"
        return Path(cache_dir) / f"{stem}_doc_order.npy", Path(cache_dir) / f"{stem}_sample_idx.npy"

    def _load(self, files: tuple[Path, Path] | None) -> tuple[np.ndarray, np.ndarray] | None:
        if files is None or not all(f.is_file() for f in files):
            return None
        self.cache_hit = True
        return np.load(files[0], mmap_mode="r"), np.load(files[1], mmap_mode="r")

    def _save(self, files: tuple[Path, Path] | None) -> None:
        self.cache_hit = False
        if files is None:
            return
        try:
            files[0].parent.mkdir(parents=True, exist_ok=True)
            for arr, final in zip((self.doc_order, self.sample_idx), files):
                # several ranks may build the same index at once: write privately, rename atomically
                tmp = final.with_name(f".{final.name}.{os.getpid()}.{uuid.uuid4().hex[:6]}.npy")
                np.save(tmp, arr)
                os.replace(tmp, final)
        except OSError:
            pass  # a read-only location only costs rebuilding the index next time


def pretraining_sample(
    window: np.ndarray,
    eos_id: int | None = None,
    *,
    reset_position_ids: bool = False,
    reset_attention_mask: bool = False,
    eod_mask_loss: bool = False,
) -> dict[str, np.ndarray]:
    """Turn a ``seq_length + 1`` token window into one sample's arrays (Megatron's options)."""
    tokens, labels = window[:-1], window[1:]
    seq = len(tokens)
    loss_mask = np.ones(seq, dtype=np.float32)
    position_ids = np.arange(seq, dtype=np.int64)
    sample = {"input_ids": tokens, "labels": labels, "loss_mask": loss_mask, "position_ids": position_ids}
    if eos_id is None:
        return sample
    is_eos = tokens == eos_id
    if eod_mask_loss:
        loss_mask[is_eos] = 0.0
    if reset_position_ids or reset_attention_mask:
        # a new document starts after every EOS
        segment = np.concatenate([[0], np.cumsum(is_eos[:-1])]).astype(np.int64)
        if reset_position_ids:
            starts = np.flatnonzero(np.concatenate([[True], segment[1:] != segment[:-1]]))
            position_ids = np.arange(seq, dtype=np.int64) - np.repeat(starts, np.diff(np.append(starts, seq)))
            sample["position_ids"] = position_ids
        if reset_attention_mask:
            sample["segment_ids"] = segment + 1
    return sample
