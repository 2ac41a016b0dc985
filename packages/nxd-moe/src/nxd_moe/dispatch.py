"""Token dispatch to experts and combine back, as all-to-all over the expert-parallel group.

Assignments (one row per kept ``(token, choice)``) are sorted by expert; with EP > 1 each rank
sends every other EP rank the rows for that rank's experts (variable split sizes: dropless routing
needs no padding) and receives rows for its own experts from every rank. ``combine`` is the exact
reverse. Both are autograd-aware: backward runs the opposite all-to-all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, output_splits, input_splits, group):  # noqa: ANN001, ANN205
        ctx.splits, ctx.group = (output_splits, input_splits), group
        out = x.new_empty((sum(output_splits), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), output_splits, input_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):  # noqa: ANN001, ANN205
        output_splits, input_splits = ctx.splits
        out = grad.new_empty((sum(input_splits), *grad.shape[1:]))
        dist.all_to_all_single(out, grad.contiguous(), input_splits, output_splits, group=ctx.group)
        return out, None, None, None


def all_to_all(x: torch.Tensor, output_splits: list[int], input_splits: list[int], group: Any) -> torch.Tensor:
    """Autograd-aware ``all_to_all_single`` with variable splits along dimension 0."""
    return _AllToAll.apply(x, output_splits, input_splits, group)


@dataclass
class DispatchPlan:
    """What :func:`combine` needs to reverse :func:`dispatch`."""

    order: torch.Tensor           # assignments sorted by expert (stable)
    local_counts: list[int]       # rows per local expert in the dispatched tokens
    send_splits: list[int] | None = None
    recv_splits: list[int] | None = None
    recv_order: torch.Tensor | None = None  # received rows -> grouped by local expert
    group: Any = None


def dispatch(tokens: torch.Tensor, token_ids: torch.Tensor, expert_ids: torch.Tensor, num_experts: int,
             ep_size: int = 1, ep_group: Any = None) -> tuple[torch.Tensor, DispatchPlan]:
    """Assignment ``i`` sends row ``token_ids[i]`` of ``tokens`` ``[T, H]`` to global expert
    ``expert_ids[i]``. Returns (rows for this rank's experts grouped by local expert, the plan).
    Assignments are taken in ``plan.order`` (sorted by expert)."""
    order = torch.argsort(expert_ids, stable=True)
    counts = torch.bincount(expert_ids, minlength=num_experts)
    grouped = tokens[token_ids[order]]
    if ep_size == 1:
        return grouped, DispatchPlan(order, counts.tolist())
    local = num_experts // ep_size
    recv_counts = torch.empty_like(counts)
    dist.all_to_all_single(recv_counts, counts, group=ep_group)  # row s: source s's counts for my experts
    send_splits = counts.view(ep_size, local).sum(1).tolist()
    recv_matrix = recv_counts.view(ep_size, local)
    recv_splits = recv_matrix.sum(1).tolist()
    received = all_to_all(grouped, recv_splits, send_splits, ep_group)
    local_ids = torch.arange(local, device=tokens.device).repeat(ep_size).repeat_interleave(recv_matrix.reshape(-1))
    recv_order = torch.argsort(local_ids, stable=True)
    plan = DispatchPlan(order, recv_matrix.sum(0).tolist(), send_splits, recv_splits, recv_order, ep_group)
    return received[recv_order], plan


def combine(outputs: torch.Tensor, plan: DispatchPlan) -> torch.Tensor:
    """Expert outputs in dispatched order -> one row per assignment, in ``plan.order``."""
    if plan.recv_order is None:
        return outputs
    received = torch.zeros_like(outputs).index_copy(0, plan.recv_order, outputs)
    return all_to_all(received, plan.send_splits, plan.recv_splits, plan.group)
