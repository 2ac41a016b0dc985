"""Router auxiliary losses."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from nxd_moe.routing import expert_affinities


def load_balancing_loss(router_logits: torch.Tensor | Sequence[torch.Tensor], num_experts: int, top_k: int,
                        attention_mask: torch.Tensor | None = None, activation: str = "softmax") -> torch.Tensor:
    """Switch-Transformer load-balancing loss, exactly as Hugging Face's Mixtral
    ``load_balancing_loss_func``: the layers' ``[T, E]`` logits are concatenated, and the loss is
    ``num_experts * sum_{k,e} (fraction of tokens whose k-th choice is e) * (mean probability of e)``.

    ``attention_mask`` ``[batch, seq]`` (1 = real token) restricts both means to real tokens; the
    logits' rows are then ordered ``(layer, batch, seq)``. ``activation="sigmoid"``: the router's
    per-expert sigmoid affinities take the place of the softmax probabilities.
    """
    if isinstance(router_logits, torch.Tensor):
        router_logits = [router_logits]
    logits = torch.cat([t.reshape(-1, num_experts) for t in router_logits], dim=0)
    probs = expert_affinities(logits, activation)
    selected = torch.topk(probs, top_k, dim=-1).indices
    expert_mask = F.one_hot(selected, num_experts).float()  # [T, k, E]
    if attention_mask is None:
        tokens_per_expert = expert_mask.mean(dim=0)
        prob_per_expert = probs.mean(dim=0)
    else:
        b, s = attention_mask.shape
        layers = logits.shape[0] // (b * s)
        mask = attention_mask.float().reshape(1, b * s).expand(layers, b * s).reshape(-1)
        tokens_per_expert = (expert_mask * mask[:, None, None]).sum(0) / mask.sum()
        prob_per_expert = (probs * mask[:, None]).sum(0) / mask.sum()
    return (tokens_per_expert * prob_per_expert.unsqueeze(0)).sum() * num_experts


def router_z_loss(router_logits: torch.Tensor | Sequence[torch.Tensor]) -> torch.Tensor:
    """ST-MoE router z-loss: mean over tokens of ``logsumexp(logits)^2`` (keeps logits small)."""
    if isinstance(router_logits, torch.Tensor):
        router_logits = [router_logits]
    logits = torch.cat([t.reshape(-1, t.shape[-1]) for t in router_logits], dim=0).float()
    return torch.logsumexp(logits, dim=-1).pow(2).mean()
