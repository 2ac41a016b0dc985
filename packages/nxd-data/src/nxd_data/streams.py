"""Endless, deterministic sample streams: global sample index -> sample.

A stream is a pure function of its index (and the seed), which is what makes resume exact: the
position in a checkpoint is a single integer, the number of consumed samples.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from nxd.errors import ConfigError


class Source(Protocol):
    def __len__(self) -> int: ...

    def __getitem__(self, i: int) -> dict[str, np.ndarray]: ...


class MappedSource:
    """``fn(i)`` over ``range(length)``: adapts a window reader to a :class:`Source`."""

    def __init__(self, length: int, fn: Callable[[int], dict[str, np.ndarray]]) -> None:
        self.length, self.fn = length, fn

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        return self.fn(i)


class ConcatSource:
    """Several finite sources one after the other (validation passes over a blend)."""

    def __init__(self, sources: Sequence[Source]) -> None:
        self.sources = list(sources)
        self.offsets = np.cumsum([0] + [len(s) for s in self.sources])

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        k = int(np.searchsorted(self.offsets, i, side="right") - 1)
        return self.sources[k][i - int(self.offsets[k])]


class EpochStream:
    """Repeats ``source`` forever; each epoch visits every sample once, in a seeded order."""

    def __init__(self, source: Source, seed: int, shuffle: bool = True) -> None:
        if len(source) == 0:
            raise ConfigError("cannot stream an empty dataset")
        self.source, self.seed, self.shuffle = source, seed, shuffle
        self._perms: dict[int, np.ndarray] = {}

    def _perm(self, epoch: int) -> np.ndarray:
        if epoch not in self._perms:
            if len(self._perms) >= 2:
                self._perms.pop(min(self._perms))
            self._perms[epoch] = np.random.default_rng([self.seed, epoch, 0x5A3B]).permutation(len(self.source))
        return self._perms[epoch]

    def __getitem__(self, g: int) -> dict[str, np.ndarray]:
        epoch, i = divmod(int(g), len(self.source))
        return self.source[int(self._perm(epoch)[i]) if self.shuffle else i]


class BlendedStream:
    """Weighted blend of streams: sample ``g`` comes from the stream whose share is furthest
    behind its weight after ``g`` samples (Megatron's greedy blending), so every prefix of the
    stream matches the weights to within one sample per dataset."""

    def __init__(self, streams: Sequence[Any], weights: Sequence[float]) -> None:
        total = float(sum(weights))
        if not streams or len(streams) != len(weights) or total <= 0 or any(w < 0 for w in weights):
            raise ConfigError("a blend needs one non-negative weight per dataset and a positive total")
        self.streams = list(streams)
        self.weights = [float(w) / total for w in weights]
        self._which = np.zeros(0, dtype=np.int32)
        self._local = np.zeros(0, dtype=np.int64)
        self._counts = [0] * len(streams)

    def _grow(self, n: int) -> None:
        start = len(self._which)
        size = max(n, 2 * start, 1024)
        which = np.empty(size - start, dtype=np.int32)
        local = np.empty(size - start, dtype=np.int64)
        counts, weights = self._counts, self.weights
        rng = range(len(weights))
        for j, g in enumerate(range(start, size)):
            d = max(rng, key=lambda k: weights[k] * (g + 1) - counts[k])
            which[j], local[j] = d, counts[d]
            counts[d] += 1
        self._which = np.concatenate([self._which, which])
        self._local = np.concatenate([self._local, local])

    def locate(self, g: int) -> tuple[int, int]:
        """(dataset, sample index within that dataset's stream) of global sample ``g``."""
        if g >= len(self._which):
            self._grow(g + 1)
        return int(self._which[g]), int(self._local[g])

    def __getitem__(self, g: int) -> dict[str, np.ndarray]:
        d, local = self.locate(int(g))
        return self.streams[d][local]
