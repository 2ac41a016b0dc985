"""Where GQA heads sit over TP when K/V heads are replicated (NxD's ``kv_size_multiplier``), and
Megatron's interleaved QKV row order; one description shared by the model families, the plan,
HF/Megatron import and checkpoint resharding.

Query heads are sharded contiguously (rank ``r`` holds heads ``[r*Lq, (r+1)*Lq)``). With
``m = kv_size_multiplier`` the KV heads are cut into ``tp / m`` pieces and piece ``r // m`` sits on
rank ``r`` (replicas on neighbouring ranks, nxd-core-parallel's Megatron layout). ``m`` is the
smallest divisor of ``tp`` for which every rank's piece holds every KV head its query heads attend
to (HF grouping: query head ``i`` uses KV head ``i // (heads / kv_heads)``): 1 when TP divides the
KV heads, ``tp / kv`` when the KV heads divide TP, and for odd counts (3 KV heads at TP=2) up to
``tp``; the attention then picks each local query head's KV head (:func:`kv_local_index`).
"""

from __future__ import annotations

import torch


def heads_of_rank(num_heads: int, num_kv_heads: int, tp: int, rank: int,
                  kv_size_multiplier: int) -> tuple[list[int], list[int]]:
    """``(query heads, kv heads)`` (global head indices) held by TP ``rank``, in local order."""
    lq, lk = num_heads // tp, num_kv_heads * kv_size_multiplier // tp
    piece = rank // kv_size_multiplier
    return list(range(rank * lq, (rank + 1) * lq)), list(range(piece * lk, (piece + 1) * lk))


def kv_local_index(num_heads: int, num_kv_heads: int, tp: int, rank: int,
                   kv_size_multiplier: int) -> list[int] | None:
    """For each local query head of ``rank``, the local KV head it attends to; None when ``rank``'s
    KV piece lacks one (or the heads are not grouped evenly)."""
    if num_heads % num_kv_heads:
        return None
    q_heads, kv_heads = heads_of_rank(num_heads, num_kv_heads, tp, rank, kv_size_multiplier)
    needed = [q // (num_heads // num_kv_heads) for q in q_heads]
    return [kv_heads.index(k) for k in needed] if all(k in kv_heads for k in needed) else None


def kv_size_multiplier_for(num_heads: int, num_kv_heads: int, tp: int) -> int | None:
    """The smallest K/V replication ``m`` (a divisor of ``tp``) that places whole heads and gives
    every rank the KV heads its query heads need; None when there is none (query heads not
    divisible by ``tp``, or not grouped evenly over the KV heads)."""
    if num_heads % tp or num_heads % num_kv_heads:
        return None
    for m in (d for d in range(1, tp + 1) if tp % d == 0):
        if (num_kv_heads * m) % tp == 0 and all(
                kv_local_index(num_heads, num_kv_heads, tp, r, m) is not None for r in range(tp)):
            return m
    return None


def local_kv_index(num_heads: int, num_kv_heads: int, tp: int, rank: int,
                   kv_size_multiplier: int) -> tuple[int, ...] | None:
    """:func:`kv_local_index` when it is not the plain grouping (each local KV head serving the
    same number of consecutive local query heads, what ``repeat_interleave`` gives); else None."""
    index = kv_local_index(num_heads, num_kv_heads, tp, rank, kv_size_multiplier)
    lq, lk = num_heads // tp, num_kv_heads * kv_size_multiplier // tp
    plain = [i // (lq // lk) for i in range(lq)] if lq % lk == 0 else None
    return None if index == plain else tuple(index)


def interleaved_to_fused(groups: int, q_per_group: int, head_rows: int) -> torch.Tensor:
    """Megatron's interleaved QKV rows (per query group ``[its q heads; k; v]``) -> the fused
    ``[all q; all k; all v]`` order: ``fused = interleaved[order]``."""
    per_group = (q_per_group + 2) * head_rows
    rows = torch.arange(groups * per_group).view(groups, q_per_group + 2, head_rows)
    q = rows[:, :q_per_group].reshape(-1)
    return torch.cat([q, rows[:, q_per_group].reshape(-1), rows[:, q_per_group + 1].reshape(-1)])


def local_fused_rows(num_heads: int, num_kv_heads: int, head_rows: int, tp: int, rank: int,
                     kv_size_multiplier: int) -> torch.Tensor:
    """Rows of the fused ``[q; k; v]`` tensor that TP ``rank`` holds, in its local order
    ``[its q heads; its kv piece's k; its kv piece's v]``."""
    q_heads, kv_heads = heads_of_rank(num_heads, num_kv_heads, tp, rank, kv_size_multiplier)

    def rows(heads: list[int], offset: int) -> list[int]:
        return [offset + h * head_rows + d for h in heads for d in range(head_rows)]

    q, kv = num_heads * head_rows, num_kv_heads * head_rows
    return torch.tensor(rows(q_heads, 0) + rows(kv_heads, q) + rows(kv_heads, q + kv), dtype=torch.long)
