"""Where each parameter lives in a param group's flat buffer, and which slice a DP rank owns.

A group's parameters are laid end to end (in the order given) in a flat buffer of ``numel``
elements, padded with zeros to ``padded_numel``, a multiple of the DP size, so every rank owns an
equal contiguous shard ``[shard_start, shard_end)``. Offsets are global (independent of the DP
size), which is what lets a checkpoint saved at one DP size be resharded to another.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class FlatLayout:
    """Flat layout of one param group for one DP rank."""

    shapes: tuple[tuple[int, ...], ...]
    offsets: tuple[int, ...]
    numel: int
    dp_size: int
    dp_rank: int

    @classmethod
    def build(cls, params: list[torch.Tensor], dp_size: int, dp_rank: int) -> FlatLayout:
        offsets, total = [], 0
        for p in params:
            offsets.append(total)
            total += p.numel()
        return cls(tuple(tuple(p.shape) for p in params), tuple(offsets), total, dp_size, dp_rank)

    @property
    def padded_numel(self) -> int:
        return -(-self.numel // self.dp_size) * self.dp_size

    @property
    def shard_size(self) -> int:
        return self.padded_numel // self.dp_size

    @property
    def shard_start(self) -> int:
        return self.dp_rank * self.shard_size

    @property
    def shard_end(self) -> int:
        return self.shard_start + self.shard_size

    def local_segments(self) -> list[tuple[int, int, int]]:
        """``(param_index, lo, hi)``: the part ``[lo, hi)`` of this rank's shard (shard-local
        indices) that holds elements of parameter ``param_index``."""
        out = []
        for i, (off, shape) in enumerate(zip(self.offsets, self.shapes)):
            n = _numel(shape)
            lo, hi = max(off, self.shard_start), min(off + n, self.shard_end)
            if lo < hi:
                out.append((i, lo - self.shard_start, hi - self.shard_start))
        return out

    def describe(self) -> dict:
        """Plain-data description saved with every checkpoint shard."""
        return {
            "numel": self.numel,
            "padded_numel": self.padded_numel,
            "shard_start": self.shard_start,
            "shard_end": self.shard_end,
            "shapes": [list(s) for s in self.shapes],
        }


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def flatten_into(buffer: torch.Tensor, tensors: list[torch.Tensor | None], layout: FlatLayout) -> torch.Tensor:
    """Copy ``tensors`` (None = zeros) into ``buffer`` at the layout's offsets; zero the padding."""
    for t, off, shape in zip(tensors, layout.offsets, layout.shapes):
        n = _numel(shape)
        if t is None:
            buffer[off:off + n].zero_()
        else:
            buffer[off:off + n].copy_(t.reshape(-1))
    buffer[layout.numel:].zero_()
    return buffer


def gather_range(shards: list[tuple[int, int, torch.Tensor]], start: int, end: int, numel: int,
                 like: torch.Tensor) -> torch.Tensor:
    """Assemble global flat range ``[start, end)`` from saved ``(shard_start, shard_end, tensor)``
    pieces; elements at or past ``numel`` (padding) are zero."""
    out = torch.zeros(end - start, dtype=like.dtype, device=like.device)
    for s, e, t in shards:
        lo, hi = max(s, start), min(e, end, numel)
        if lo < hi:
            out[lo - start:hi - start].copy_(t[lo - s:hi - s])
    return out


def global_runs(shapes: list[tuple[int, ...]] | tuple[tuple[int, ...], ...], partition_size: int, partition_rank: int,
                start: int, end: int) -> list[tuple[int, int, int]]:
    """``(local_offset, global_offset, length)`` runs placing the flat range ``[start, end)`` of a
    buffer of parameters ``shapes`` in the flat buffer of the *full* parameters, when each held
    parameter is slice ``partition_rank`` (along dimension 0) of a parameter ``partition_size``
    times larger. The full layout does not depend on the partition size, which is what lets
    a checkpoint reshard across it; with ``partition_size == 1`` it is the identity."""
    runs: list[tuple[int, int, int]] = []
    off = goff = 0
    for shape in shapes:
        n = _numel(tuple(shape))
        lo, hi = max(off, start), min(off + n, end)
        if lo < hi:
            run = (lo, goff + partition_rank * n + lo - off, hi - lo)
            last = runs[-1] if runs else None
            if last and last[0] + last[2] == run[0] and last[1] + last[2] == run[1]:
                runs[-1] = (last[0], last[1], last[2] + run[2])
            else:
                runs.append(run)
        off, goff = off + n, goff + n * partition_size
    return runs
