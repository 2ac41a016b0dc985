"""Splitting a batch over context-parallel ranks (NxD's ``get_batch_on_this_context_parallel_rank``)."""

from __future__ import annotations

from typing import Any

import torch

from nxd.parallel import ParallelContext, resolve_context
from nxd_context_parallel.layout import check_divisible, local_indices


def split_batch_for_context_parallel(batch: dict[str, Any], cp_rank: int, cp_size: int, *,
                                     load_balance: bool = True, seq_dim: int = 1) -> dict[str, Any]:
    """This CP rank's part of ``batch``: every tensor with a sequence dimension (``seq_dim``,
    length > 1) keeps the positions :func:`~nxd_context_parallel.layout.local_indices`
    names; others pass through. ``position_ids`` are added (``0 .. seq-1`` per row) when the batch
    has none, so RoPE sees the global positions of the local tokens.

    Labels must already be aligned with the inputs (nxd's batches are: ``labels[t]`` is the target
    at position ``t``), so unlike NxD's helper no label shift happens here."""
    if cp_size == 1:
        return batch
    input_ids = batch.get("input_ids")
    if not isinstance(input_ids, torch.Tensor):
        raise ValueError("context parallelism splits the batch along 'input_ids'; the batch has none")
    seq = input_ids.shape[seq_dim]
    check_divisible(seq, cp_size, load_balance, what=f"sequence length (input_ids dim {seq_dim})")
    index = local_indices(seq, cp_rank, cp_size, load_balance, device=input_ids.device)
    out = dict(batch)
    if out.get("position_ids") is None:
        shape = [1] * input_ids.dim()
        shape[seq_dim] = seq
        out["position_ids"] = torch.arange(seq, device=input_ids.device).view(shape).expand_as(input_ids)
    for key, value in out.items():
        if isinstance(value, torch.Tensor) and value.dim() > seq_dim and value.shape[seq_dim] > 1:
            if value.shape[seq_dim] != seq:
                raise ValueError(f"batch[{key!r}] has {value.shape[seq_dim]} positions along dim {seq_dim}, "
                                 f"input_ids has {seq}: every per-token tensor must match to be split over CP")
            out[key] = value.index_select(seq_dim, index)
    return out


def get_batch_on_this_context_parallel_rank(batch: dict[str, Any], load_balance: bool = True,
                                            context: ParallelContext | None = None) -> dict[str, Any]:
    """NxD's name: this rank's part of a batch-first ``batch`` under the CP degree and rank of
    ``context`` (the current one when left out; the batch unchanged when CP is 1). See
    :func:`split_batch_for_context_parallel` for the layout and why labels are not shifted here."""
    context = resolve_context(context)
    if context is None:
        return batch
    return split_batch_for_context_parallel(batch, context.cp.rank, context.cp.size, load_balance=load_balance)
