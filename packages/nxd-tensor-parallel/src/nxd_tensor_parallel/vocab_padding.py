"""Vocabulary padding, one rule for every family: the embedding and output layer hold ``padded``
rows (to a multiple of the TP size, ``pad=True``; Megatron's families to a multiple of
``make_vocab_size_divisible_by * TP``), so every TP rank gets an equal slice, and the rows past the
real vocabulary are hidden: their logits are ``-inf`` (:func:`mask_padded_vocab`) and checkpoint
import/export reads and writes only the real rows.

Why ``-inf`` and not the dtype's minimum: a class with logit ``-inf`` is exactly absent. The
vocabulary-parallel cross-entropy's label smoothing counts the classes with a finite logit (torch's
definition over the real vocabulary) and sums their log-probabilities; a padded class at
``finfo.min`` would count as a class and add ``~-3.4e38`` to that sum. Softmax, sampling and the
loss without smoothing give the same result either way (``exp`` of both is 0).
"""

from __future__ import annotations

import torch


def padded_vocab_size(vocab_size: int, divisible_by: int, tp: int) -> int:
    """``vocab_size`` rounded up to a multiple of ``divisible_by * tp``."""
    multiple = int(divisible_by) * int(tp)
    return -(-int(vocab_size) // multiple) * multiple


def vocab_rows(*layers: torch.nn.Module | None) -> int:
    """Rows over all TP ranks of the first vocabulary layer given that this pipeline stage holds
    (the embedding or the LM head): its vocabulary while plain, with the padding (``pad_size``)
    once the plan has made it a padded parallel layer."""
    layer = next(layer for layer in layers if layer is not None)
    real = layer.num_embeddings if hasattr(layer, "num_embeddings") else getattr(layer, "output_size", None)
    return (real if real is not None else layer.out_features) + getattr(layer, "pad_size", 0)


def real_vocab_rows(vocab_size: int, padded: int, tp: int, tp_rank: int) -> range:
    """The real (unpadded) vocabulary rows of TP rank ``tp_rank``'s slice of ``padded`` rows."""
    per = padded // tp
    return range(tp_rank * per, min((tp_rank + 1) * per, vocab_size))


def mask_padded_vocab(logits: torch.Tensor, vocab_size: int, tp_rank: int) -> torch.Tensor:
    """TP rank ``tp_rank``'s vocabulary-parallel ``logits`` ``[..., padded/tp]`` with the padded
    columns (global index >= ``vocab_size``) set to ``-inf``: probability zero, no gradient
    (unchanged when this rank holds no padding)."""
    local = logits.shape[-1]
    start = tp_rank * local
    if start + local <= vocab_size:
        return logits
    padded = torch.arange(start, start + local, device=logits.device) >= vocab_size
    return logits.masked_fill(padded, float("-inf"))
