"""Megatron's vocabulary padding: the embedding and output layer hold ``padded`` rows (a multiple of
``make_vocab_size_divisible_by * TP``, so every TP rank gets an equal slice), and the rows past the
real vocabulary are hidden: their logits get the dtype's minimum (no probability, no loss), and
checkpoint import/export reads and writes only the real rows."""

from __future__ import annotations

import torch

from nxd_core_parallel.parallel_layers.utils import mark_padding


def padded_vocab_size(vocab_size: int, divisible_by: int, tp: int) -> int:
    """``vocab_size`` rounded up to a multiple of ``divisible_by * tp``."""
    multiple = int(divisible_by) * int(tp)
    return -(-int(vocab_size) // multiple) * multiple


def mark_vocab_padding(weight: torch.Tensor, vocab_size: int, divisible_by: int) -> None:
    """Mark a vocabulary-parallel ``weight`` of ``padded_vocab_size(vocab_size, divisible_by, tp)``
    rows as ``pad=True`` layers mark theirs (the real size, then zero rows to a multiple of
    ``divisible_by`` per rank): nxd checkpoints then hold the real rows and re-pad them for the
    loading TP, whose padding differs."""
    mark_padding(weight, vocab_size, divisible_by)


def real_vocab_rows(vocab_size: int, padded: int, tp: int, tp_rank: int) -> range:
    """The real (unpadded) vocabulary rows of TP rank ``tp_rank``'s slice of ``padded`` rows."""
    per = padded // tp
    return range(tp_rank * per, min((tp_rank + 1) * per, vocab_size))


def mask_padded_vocab(logits: torch.Tensor, vocab_size: int, tp_rank: int) -> torch.Tensor:
    """TP rank ``tp_rank``'s vocabulary-parallel ``logits`` ``[..., padded/tp]`` with the padded
    columns set to the dtype's minimum (unchanged when this rank holds no padding)."""
    local = logits.shape[-1]
    start = tp_rank * local
    if start + local <= vocab_size:
        return logits
    padded = torch.arange(start, start + local, device=logits.device) >= vocab_size
    return logits.masked_fill(padded, torch.finfo(logits.dtype).min)
