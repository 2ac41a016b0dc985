"""Routers: which experts each token goes to, and with which affinity.

Both routers own one replicated ``weight`` ``[num_experts, hidden]`` (Hugging Face's
``MixtralTopKRouter.weight`` / ``block_sparse_moe.gate.weight``) and return
``(router_logits [T, E], expert_probs [T, E] fp32 affinities, expert_index [T, k])``; the
affinities are the softmax over experts, or with ``activation="sigmoid"`` each expert's sigmoid
(NxD's ``act_fn``; the top-k choice is the same, both are monotonic in the logits).
"""

from __future__ import annotations

import math
import weakref

import torch
import torch.nn.functional as F
from torch import nn


class _RouterBase(nn.Module):
    def __init__(self, num_experts: int, top_k: int, hidden_size: int, dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None, init_std: float | None = None,
                 activation: str = "softmax") -> None:
        super().__init__()
        if not 0 < top_k <= num_experts:
            raise ValueError(f"top_k={top_k} must be in [1, num_experts={num_experts}]")
        self.activation = activation
        self.num_experts, self.top_k, self.hidden_size = num_experts, top_k, hidden_size
        self.init_std = init_std
        self.weight = nn.Parameter(torch.empty(num_experts, hidden_size, dtype=dtype, device=device))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.weight.is_meta:
            return
        if self.init_std is None:
            nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        else:
            nn.init.normal_(self.weight, 0.0, self.init_std)

    def logits_and_probs(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = F.linear(hidden_states, self.weight)
        return logits, expert_affinities(logits, self.activation)

    def choose(self, probs: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """``[T, top_k]`` chosen experts (no gradient) from ``[T, E]`` probabilities and logits."""
        raise NotImplementedError

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        logits, probs = self.logits_and_probs(hidden_states)
        with torch.no_grad():
            index = self.choose(probs.detach(), logits.detach())
        return logits, probs, index


class RouterTopK(_RouterBase):
    """Each token goes to its ``top_k`` most probable experts (train with the load-balancing loss).

    DeepSeek-V3's variants: ``n_group > 1`` limits the choice to the ``topk_group`` expert groups
    whose two best scores sum highest (group-limited routing); ``expert_bias`` adds the buffer
    ``e_score_correction_bias`` ``[E]`` (Hugging Face's name) to the scores for the choice only (the
    affinities that weight the experts stay unbiased) and, in training, counts each expert's
    assignments in ``expert_load`` for :mod:`nxd_moe.balancer`."""

    def __init__(self, num_experts: int, top_k: int, hidden_size: int, n_group: int = 1, topk_group: int = 1,
                 expert_bias: bool = False, **kwargs: object) -> None:
        super().__init__(num_experts, top_k, hidden_size, **kwargs)
        self.n_group, self.topk_group = n_group, topk_group
        #: b_i <- b_i + bias_update_rate * sign(mean load - load_i) after each step (nxd_moe.balancer)
        self.bias_update_rate = 0.001
        if expert_bias:
            self.weight.nxd_moe_router = weakref.ref(self)  # how nxd_moe.balancer finds it from the optimizer
            device = self.weight.device
            self.register_buffer("e_score_correction_bias", torch.zeros(num_experts, device=device))
            self.register_buffer("expert_load", torch.zeros(num_experts, device=device), persistent=False)
        else:
            self.e_score_correction_bias = None

    def choose(self, probs: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        scores = probs if self.e_score_correction_bias is None else probs + self.e_score_correction_bias
        if self.n_group > 1:
            scores = group_limited_scores(scores, self.n_group, self.topk_group)
        index = torch.topk(scores, self.top_k, dim=-1).indices
        if self.e_score_correction_bias is not None and self.training:
            # a count per expert (index_add, not bincount: it also runs on the meta device nxd plan uses)
            flat = index.reshape(-1)
            self.expert_load.index_add_(0, flat, torch.ones(flat.shape, dtype=self.expert_load.dtype, device=flat.device))
        return index


def group_limited_scores(scores: torch.Tensor, n_group: int, topk_group: int) -> torch.Tensor:
    """``scores`` ``[T, E]`` with every expert outside each token's ``topk_group`` best groups set to
    ``-inf``; a group's score is the sum of its two best experts' (DeepSeek-V3's ``group_scores``)."""
    t, e = scores.shape
    grouped = scores.view(t, n_group, e // n_group)
    group_scores = grouped.topk(min(2, e // n_group), dim=-1).values.sum(-1)
    keep = torch.zeros_like(group_scores, dtype=torch.bool)
    keep.scatter_(1, group_scores.topk(topk_group, dim=-1).indices, True)
    return grouped.masked_fill(~keep.unsqueeze(-1), float("-inf")).view(t, e)


class RouterSinkhorn(_RouterBase):
    """Top-1 routing where, in training, the expert choice is balanced by a fixed number of Sinkhorn
    iterations on ``exp(logits)`` (Megatron/NxD); affinities are still the plain softmax. Evaluation
    routes by the raw logits."""

    def __init__(self, num_experts: int, top_k: int, hidden_size: int, sinkhorn_iterations: int = 30,
                 sinkhorn_tol: float | None = None, **kwargs: object) -> None:
        if top_k != 1:
            raise ValueError("RouterSinkhorn routes top-1 only (as NxD's RouterSinkhorn)")
        super().__init__(num_experts, top_k, hidden_size, **kwargs)
        self.sinkhorn_iterations, self.sinkhorn_tol = sinkhorn_iterations, sinkhorn_tol

    def choose(self, probs: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        scores = sinkhorn(logits.float(), self.sinkhorn_iterations, tol=self.sinkhorn_tol) if self.training \
            else logits
        return scores.argmax(dim=-1, keepdim=True)


def expert_affinities(logits: torch.Tensor, activation: str = "softmax") -> torch.Tensor:
    """``[T, E]`` fp32 affinities from router logits: softmax over experts, or per-expert sigmoid."""
    if activation == "softmax":
        return F.softmax(logits.float(), dim=-1)
    if activation == "sigmoid":
        return torch.sigmoid(logits.float())
    raise ValueError(f"router activation must be 'softmax' or 'sigmoid', got {activation!r}")


def sinkhorn(cost: torch.Tensor, num_iters: int, eps: float = 1e-8, tol: float | None = None) -> torch.Tensor:
    """Balance ``exp(cost)`` ``[T, E]`` towards equal row and column sums with ``num_iters``
    alternating normalisations (not run to convergence, as in Megatron-LM and NxD), stopping early
    once the mean change of the column scaling is below ``tol`` when given."""
    if num_iters == 0:
        return cost
    cost = torch.exp(cost)
    d0 = torch.ones(cost.shape[0], dtype=cost.dtype, device=cost.device)
    d1 = torch.ones(cost.shape[1], dtype=cost.dtype, device=cost.device)
    for _ in range(num_iters):
        d0 = (1.0 / d0.numel()) / ((d1 * cost).sum(1) + eps)
        d1_old, d1 = d1, (1.0 / d1.numel()) / ((d0.unsqueeze(1) * cost).sum(0) + eps)
        if tol is not None and float((d1_old - d1).abs().mean()) < tol:
            break
    return d1 * cost * d0.unsqueeze(1)


def make_router(routing_algorithm: str, num_experts: int, top_k: int, hidden_size: int,
                sinkhorn_iterations: int = 30, sinkhorn_tol: float | None = None, **kwargs: object) -> nn.Module:
    """``"top_k"`` -> :class:`RouterTopK`, ``"sinkhorn"`` -> :class:`RouterSinkhorn`."""
    if routing_algorithm == "top_k":
        return RouterTopK(num_experts, top_k, hidden_size, **kwargs)
    kwargs = {k: v for k, v in kwargs.items() if k not in ("n_group", "topk_group", "expert_bias")}
    if routing_algorithm == "sinkhorn":
        return RouterSinkhorn(num_experts, top_k, hidden_size, sinkhorn_iterations=sinkhorn_iterations,
                              sinkhorn_tol=sinkhorn_tol, **kwargs)
    raise ValueError(f"routing_algorithm must be 'top_k' or 'sinkhorn', got {routing_algorithm!r}")
