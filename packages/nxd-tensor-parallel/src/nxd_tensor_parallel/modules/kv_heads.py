"""Where GQA heads sit over TP when K/V heads are replicated (NxD's ``kv_size_multiplier``), and
Megatron's interleaved QKV row order; one description shared by the model families, the plan,
HF/Megatron import and checkpoint resharding.

Query heads are sharded contiguously (rank ``r`` holds heads ``[r*Lq, (r+1)*Lq)``). With
``m = kv_size_multiplier`` the KV heads are cut into ``tp / m`` pieces and piece ``r // m`` sits on
rank ``r`` (replicas on neighbouring ranks, nxd-tensor-parallel's Megatron layout). ``m`` is the
smallest divisor of ``tp`` for which every rank's piece holds every KV head its query heads attend
to (HF grouping: query head ``i`` uses KV head ``i // (heads / kv_heads)``): 1 when TP divides the
KV heads, ``tp / kv`` when the KV heads divide TP, and for odd counts (3 KV heads at TP=2) up to
``tp``; the attention then picks each local query head's KV head (:func:`kv_local_index`).
"""

from __future__ import annotations

from dataclasses import dataclass

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


@dataclass(frozen=True)
class HeadPadding:
    """Query heads padded so TP divides them (NxD's ``pad_model`` for GQA attention).

    The padded model has ``kv_groups`` KV groups of ``group_slots`` query heads each: real KV head
    ``j`` keeps its real query heads in the first slots of group ``j`` (padded query heads fill the
    rest of the group, NxD's trn2 layout, :func:`~nxd_tensor_parallel.parallel_layers.pad.generate_padding_mask`),
    and groups past ``num_kv_heads`` are zero K/V heads with zero query heads (MHA pads this way,
    as NxD's ``pad_model`` pads separate q/k/v projections). Padded weights are zero and the
    attention multiplies padded heads' output by 0 (:meth:`query_mask`), so the model computes what
    the unpadded one does and the padding gets no gradient. Without padding, ``group_slots`` and
    ``kv_groups`` are the real counts."""

    num_heads: int
    num_kv_heads: int
    #: query-head slots per KV group (the real ``num_heads // num_kv_heads`` first)
    group_slots: int
    #: KV groups (the real ``num_kv_heads`` first, then zero groups)
    kv_groups: int

    @property
    def padded_heads(self) -> int:
        return self.group_slots * self.kv_groups

    @property
    def padded(self) -> bool:
        return self.padded_heads != self.num_heads

    def query_slots(self) -> list[int | None]:
        """For each padded query head, the real head it holds (None: padding)."""
        g = self.num_heads // self.num_kv_heads
        return [j * g + s if j < self.num_kv_heads and s < g else None
                for j in range(self.kv_groups) for s in range(self.group_slots)]

    def kv_slots(self) -> list[int | None]:
        """For each padded KV head, the real KV head it holds (None: a zero group)."""
        return [j if j < self.num_kv_heads else None for j in range(self.kv_groups)]

    def kv_size_multiplier(self, tp: int) -> int:
        """The K/V replication of the padded heads over ``tp`` (:func:`kv_size_multiplier_for`)."""
        m = kv_size_multiplier_for(self.padded_heads, self.kv_groups, tp)
        if m is None:
            raise ValueError(f"{self.padded_heads} query heads in {self.kv_groups} groups do not split over TP={tp}")
        return m

    def heads_of_rank(self, tp: int, rank: int) -> tuple[list[int | None], list[int | None]]:
        """``(query heads, kv heads)`` TP ``rank`` holds, as real head indices (None: padding)."""
        q, kv = heads_of_rank(self.padded_heads, self.kv_groups, tp, rank, self.kv_size_multiplier(tp))
        q_slots, kv_slots = self.query_slots(), self.kv_slots()
        return [q_slots[h] for h in q], [kv_slots[h] for h in kv]

    def local_kv_index(self, tp: int, rank: int) -> tuple[int, ...] | None:
        """:func:`local_kv_index` of the padded heads."""
        return local_kv_index(self.padded_heads, self.kv_groups, tp, rank, self.kv_size_multiplier(tp))

    def query_mask(self, tp: int, rank: int) -> tuple[bool, ...] | None:
        """Which of ``rank``'s query heads are real; None when none of its heads is padding."""
        if not self.padded:
            return None  # no rank holds a padded head
        q, _ = self.heads_of_rank(tp, rank)
        keep = tuple(h is not None for h in q)
        return None if all(keep) else keep

    def real_rows(self, head_dim: int, kv: bool) -> torch.Tensor:
        """Where the rows of the real ``[q; k; v]`` tensor (``kv=False``: ``q`` alone, an output
        projection's input columns) sit in the padded one, in real order."""
        def rows(slots: list[int | None], count: int, offset: int) -> list[int]:
            at = {real: i for i, real in enumerate(slots) if real is not None}
            return [offset + at[h] * head_dim + d for h in range(count) for d in range(head_dim)]

        out = rows(self.query_slots(), self.num_heads, 0)
        if kv:
            q, k = self.padded_heads * head_dim, self.kv_groups * head_dim
            out += rows(self.kv_slots(), self.num_kv_heads, q) + rows(self.kv_slots(), self.num_kv_heads, q + k)
        return torch.tensor(out, dtype=torch.long)

    def size(self, head_dim: int, kv: bool) -> int:
        """Rows of the padded ``[q; k; v]`` (``kv=False``: ``q``)."""
        return (self.padded_heads + (2 * self.kv_groups if kv else 0)) * head_dim

    def pad(self, real: torch.Tensor, dim: int, head_dim: int, kv: bool) -> torch.Tensor:
        """The real ``[q; k; v]`` (or ``q``) tensor along ``dim`` with zero padded heads inserted."""
        shape = list(real.shape)
        shape[dim] = self.size(head_dim, kv)
        return real.new_zeros(shape).index_copy_(dim, self.real_rows(head_dim, kv).to(real.device), real)

    def unpad(self, padded: torch.Tensor, dim: int, head_dim: int, kv: bool) -> torch.Tensor:
        """The real heads of a padded tensor along ``dim`` (:meth:`pad` undone)."""
        return padded.index_select(dim, self.real_rows(head_dim, kv).to(padded.device))


def head_padding_for(num_heads: int, num_kv_heads: int, tp: int) -> HeadPadding:
    """The padded layout with the fewest query heads that TP splits into whole heads with every
    rank's KV heads at hand (query heads added inside KV groups and/or zero groups added; NxD pads
    to a multiple of TP, which this is whenever K/V groups allow it). The unpadded layout when TP
    divides ``num_heads``; ``ValueError`` when the heads are not grouped evenly."""
    if num_heads % num_kv_heads:
        raise ValueError(f"num_attention_heads ({num_heads}) must be a multiple of num_key_value_heads "
                         f"({num_kv_heads})")
    g = num_heads // num_kv_heads
    if num_heads % tp == 0:
        return HeadPadding(num_heads, num_kv_heads, g, num_kv_heads)
    best: HeadPadding | None = None
    for groups in range(num_kv_heads, num_kv_heads + tp + 1):  # a multiple of tp groups always splits
        for slots in range(g, g + tp + 1):
            n = groups * slots
            if n % tp == 0 and (best is None or n < best.padded_heads) \
                    and kv_size_multiplier_for(n, groups, tp) is not None:
                best = HeadPadding(num_heads, num_kv_heads, slots, groups)
    assert best is not None
    return best
