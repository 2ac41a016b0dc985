"""Expert capacity and token dropping (NxD's ``forward_capacity_factor`` semantics)."""

from __future__ import annotations

import math

import torch


def expert_capacity(num_tokens: int, num_experts: int, top_k: int, capacity_factor: float) -> int:
    """``min(ceil(tokens * top_k * capacity_factor / num_experts), tokens)``."""
    return min(math.ceil(num_tokens * top_k * capacity_factor / num_experts), num_tokens)


def kept_assignments(expert_index: torch.Tensor, num_experts: int, capacity: int) -> torch.Tensor:
    """``[T, k]`` bool: which (token, choice) assignments fit. Tokens are taken in order: a token's
    position in expert ``e`` is the number of tokens ``<=`` it (in token order) routed to ``e``; those
    past ``capacity`` are dropped."""
    t, k = expert_index.shape
    onehot = torch.zeros(t, num_experts, dtype=torch.int64, device=expert_index.device)
    onehot.scatter_(1, expert_index, 1)
    position = onehot.cumsum(dim=0)  # [T, E], 1-based position of each token in each expert
    return position.gather(1, expert_index) <= capacity


def max_routed_rows(num_tokens: int, num_experts: int, top_k: int, ep_size: int = 1,
                    capacity_factor: float | None = None) -> int:
    """The most (token, expert) rows one EP rank's experts can receive when every EP rank routes
    ``num_tokens`` tokens: each source rank sends at most ``min(tokens * top_k, local experts x
    per-expert limit)`` rows to one rank (the limit: the capacity with ``capacity_factor``, else
    ``tokens``, a token choosing an expert once). At EP=1 without capacity it is exactly
    ``tokens * top_k``; with EP > 1 it is the worst case (every source's choices on this rank's
    experts), what a memory plan must hold."""
    local = num_experts // ep_size
    per_expert = num_tokens if capacity_factor is None else expert_capacity(num_tokens, num_experts, top_k,
                                                                            capacity_factor)
    return ep_size * min(num_tokens * top_k, local * per_expert)
