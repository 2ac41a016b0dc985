"""The data module every factory returns: DP-sharded micro-batches over a deterministic stream.

Sampling follows Megatron's pretraining sampler: the global sample stream is cut into chunks of
``micro_batch_size * dp_size``; DP rank ``r`` takes slice ``[r*mbs, (r+1)*mbs)`` of each chunk.
The ``global_batch_size / (mbs * dp)`` chunks of one optimizer step are therefore disjoint across
ranks and together cover exactly the step's global batch. The only state is
``consumed_samples`` (global, counted over all DP ranks), so resuming is exact, and even a
different DP size continues the same global stream.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from nxd.errors import ConfigError
from nxd_data.streams import Source


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
        self.attention_mask = attention_mask
        self.consumed_samples = 0
        self.info = info or {}

    @property
    def chunk(self) -> int:
        return self.micro_batch_size * self.dp_size

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
