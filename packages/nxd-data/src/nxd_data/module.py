"""The data module every factory returns: DP-sharded micro-batches over a deterministic stream,
and the streams themselves.

Sampling follows Megatron's pretraining sampler: the global sample stream is cut into chunks of
``micro_batch_size * dp_size``; DP rank ``r`` takes slice ``[r*mbs, (r+1)*mbs)`` of each chunk.
The ``global_batch_size / (mbs * dp)`` chunks of one optimizer step are therefore disjoint across
ranks and together cover exactly the step's global batch. The only state is
``consumed_samples`` (global, counted over all DP ranks), so resuming is exact, and even a
different DP size continues the same global stream.

Streams are endless and deterministic (global sample index -> sample): a stream is a pure function
of its index (and the seed), which is what makes resume exact: the position in a checkpoint is a
single integer, the number of consumed samples.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import numpy as np
import torch

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


def config_flag(config: dict, key: str, default: bool) -> bool:
    """The boolean ``data.<key>`` of a data module's config (``default`` when absent)."""
    value = config.get(key, default)
    if not isinstance(value, bool):
        raise ConfigError(f"data.{key} must be true or false, got {value!r}")
    return value


def check_seq_length(config: dict, seq_length: int) -> None:
    """``data.seq_length``, when given, must be the model's."""
    if config.get("seq_length") is not None and config["seq_length"] != seq_length:
        raise ConfigError(f"data.seq_length={config['seq_length']} differs from the model's seq_length={seq_length}")


def check_geometry(seq_length: int, micro_batch_size: int, global_batch_size: int, dp_rank: int, dp_size: int) -> None:
    for name, value in (("seq_length", seq_length), ("micro_batch_size", micro_batch_size),
                        ("global_batch_size", global_batch_size), ("dp_size", dp_size)):
        if not isinstance(value, int) or value <= 0:
            raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    if not 0 <= dp_rank < dp_size:
        raise ConfigError(f"dp_rank={dp_rank} is outside 0..{dp_size - 1}")
    if global_batch_size % (micro_batch_size * dp_size):
        raise ConfigError(
            f"global_batch_size={global_batch_size} must be a multiple of micro_batch_size*dp_size="
            f"{micro_batch_size}*{dp_size}={micro_batch_size * dp_size}"
        )


def begin_build(factory: Any, config: dict, needs: tuple[str, ...] | None, *, seq_length: int, micro_batch_size: int,
                global_batch_size: int, dp_rank: int, dp_size: int) -> None:
    """What every data factory checks before it reads a file: the batch geometry, ``data.seq_length``
    against the model's, and the factory's own ``validate(config)`` when a key it ``needs`` is
    missing (``()``: always; ``None``: never, the build validates as it reads), so the error names the key."""
    check_geometry(seq_length, micro_batch_size, global_batch_size, dp_rank, dp_size)
    check_seq_length(config, seq_length)
    if needs is not None and (not needs or any(key not in config for key in needs)):
        factory.validate(config)


def collate(samples: Sequence[dict[str, np.ndarray]], attention_mask: bool = True) -> dict[str, torch.Tensor]:
    """Stack samples into ``[b, s]`` tensors; a ``segment_ids`` key also yields the boolean
    ``[b, 1, s, s]`` attention mask (same segment and causal), see docs/plugins/data.md."""
    batch: dict[str, torch.Tensor] = {}
    for key in samples[0]:
        arr = np.stack([s[key] for s in samples])
        batch[key] = torch.from_numpy(arr.astype(np.float32 if key == "loss_mask" else np.int64, copy=False))
    if attention_mask and "segment_ids" in batch:
        seg = batch["segment_ids"]
        s = seg.shape[1]
        causal = torch.ones(s, s, dtype=torch.bool).tril()
        batch["attention_mask"] = ((seg[:, :, None] == seg[:, None, :]) & causal).unsqueeze(1)
    return batch


class StreamDataModule:
    """Implements :class:`nxd.specs.DataModule` over a train stream and a finite validation source."""

    def __init__(
        self,
        train_stream: Any,
        valid_source: Source | None,
        *,
        seq_length: int,
        micro_batch_size: int,
        global_batch_size: int,
        dp_rank: int,
        dp_size: int,
        seed: int,
        attention_mask: bool = True,
        info: dict[str, Any] | None = None,
    ) -> None:
        check_geometry(seq_length, micro_batch_size, global_batch_size, dp_rank, dp_size)
        self.train_stream, self.valid_source = train_stream, valid_source
        self.seq_length, self.micro_batch_size, self.global_batch_size = seq_length, micro_batch_size, global_batch_size
        self.dp_rank, self.dp_size, self.seed = dp_rank, dp_size, seed
        #: samples one micro-batch step takes from the global stream (every DP rank's micro-batch)
        self.chunk = micro_batch_size * dp_size
        self.attention_mask = attention_mask
        self.consumed_samples = 0
        self.info = info or {}

    def rank_indices(self, consumed: int) -> list[int]:
        """Global sample indices of this rank's next micro-batch after ``consumed`` samples."""
        start = consumed + self.dp_rank * self.micro_batch_size
        return list(range(start, start + self.micro_batch_size))

    def train_batches(self) -> Iterator[dict[str, torch.Tensor]]:
        while True:
            indices = self.rank_indices(self.consumed_samples)
            batch = collate([self.train_stream[i] for i in indices], self.attention_mask)
            self.consumed_samples += self.chunk  # counted before yielding: state_dict() is "after this batch"
            yield batch

    def valid_batches(self) -> Iterator[dict[str, torch.Tensor]]:
        if self.valid_source is None:
            return
        total = len(self.valid_source)
        for start in range(0, total - self.chunk + 1, self.chunk):
            indices = self.rank_indices(start)
            yield collate([self.valid_source[i] for i in indices], self.attention_mask)

    def num_valid_batches(self) -> int:
        return 0 if self.valid_source is None else len(self.valid_source) // self.chunk

    def state_dict(self) -> dict[str, Any]:
        return {
            "consumed_samples": self.consumed_samples,
            "seed": self.seed,
            "seq_length": self.seq_length,
            "global_batch_size": self.global_batch_size,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        consumed = state.get("consumed_samples")
        if not isinstance(consumed, int) or consumed < 0:
            raise ConfigError(f"data state: consumed_samples must be a non-negative integer, got {consumed!r}")
        for key in ("seed", "seq_length"):
            if key in state and state[key] != getattr(self, key):
                raise ConfigError(
                    f"data state was saved with {key}={state[key]} but this run uses {key}={getattr(self, key)}: "
                    "the sample stream would not continue where it stopped"
                )
        if consumed % self.chunk:
            raise ConfigError(
                f"data state: consumed_samples={consumed} is not a multiple of micro_batch_size*dp_size={self.chunk}"
            )
        self.consumed_samples = consumed
