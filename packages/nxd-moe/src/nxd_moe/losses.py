"""Router auxiliary losses, and the per-layer statistics they are made of.

Hugging Face's Mixtral load-balancing loss concatenates every layer's router logits, so it is not
a sum of per-layer losses: the gradient reaching one layer's router depends on the expert counts
of all layers. It is, however, a function of a few sums over layers (:func:`router_statistics`):
``aux = E * sum_e C_e * P_e / L^2`` with ``C_e`` the (per-token) count of choices of expert ``e``
and ``P_e`` its (per-token) summed probability, both summed over the ``L`` layers. A pipeline stage
adds its layers' statistics to those of the stages before it and passes the ``2E + 1`` numbers on
with the hidden state (:mod:`nxd_moe.pipeline`); the last stage computes the exact loss, and the
gradient of ``P`` flows back through the pipeline like the hidden state's.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from nxd_moe.routing import expert_affinities


def router_statistics_size(num_experts: int) -> int:
    """Length of a :func:`router_statistics` vector."""
    return 2 * num_experts + 1


def router_statistics(router_logits: torch.Tensor, num_experts: int, top_k: int,
                      attention_mask: torch.Tensor | None = None, activation: str = "softmax") -> torch.Tensor:
    """One layer's fp32 ``[2E + 1]`` contribution to the router losses: the mean over (real) tokens
    of each expert's probability (differentiable), the mean over (real) tokens of the number of a
    token's top-``k`` choices that are each expert (no gradient), and the mean over all tokens of
    ``logsumexp(logits)^2`` (z-loss). Statistics of several layers add up.

    ``router_logits`` ``[T, E]`` (rows batch-major); ``attention_mask`` ``[batch, seq]`` (1 = real
    token, ``batch * seq == T``) restricts the first two means to real tokens, as Hugging Face does.
    """
    logits = router_logits.reshape(-1, num_experts)
    probs = expert_affinities(logits, activation)
    with torch.no_grad():
        chosen = F.one_hot(torch.topk(probs, top_k, dim=-1).indices, num_experts).sum(1).float()  # [T, E]
    if attention_mask is None:
        prob_mean, count_mean = probs.mean(0), chosen.mean(0)
    else:
        mask = attention_mask.reshape(-1).to(probs.dtype)
        if mask.numel() != logits.shape[0]:
            raise ValueError(f"attention_mask {tuple(attention_mask.shape)} does not cover the router's "
                             f"{logits.shape[0]} tokens")
        tokens = mask.sum()
        prob_mean, count_mean = (probs * mask[:, None]).sum(0) / tokens, (chosen * mask[:, None]).sum(0) / tokens
    z = torch.logsumexp(logits.float(), dim=-1).pow(2).mean()
    return torch.cat([prob_mean, count_mean, z.reshape(1)])


def losses_from_router_statistics(stats: torch.Tensor, num_layers: int, num_experts: int
                                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(load-balancing loss, z-loss)`` from the :func:`router_statistics` summed over ``num_layers``."""
    prob, count, z = stats[:num_experts], stats[num_experts:2 * num_experts], stats[2 * num_experts]
    aux = (count.detach() * prob).sum() * (num_experts / num_layers ** 2)
    return aux, z / num_layers


def _summed_statistics(router_logits: Sequence[torch.Tensor], num_experts: int, top_k: int,
                       attention_mask: torch.Tensor | None, activation: str) -> torch.Tensor:
    stats = [router_statistics(t, num_experts, top_k, attention_mask, activation) for t in router_logits]
    return torch.stack(stats).sum(0)


def load_balancing_loss(router_logits: torch.Tensor | Sequence[torch.Tensor], num_experts: int, top_k: int,
                        attention_mask: torch.Tensor | None = None, activation: str = "softmax") -> torch.Tensor:
    """Switch-Transformer load-balancing loss, exactly as Hugging Face's Mixtral
    ``load_balancing_loss_func``: over the layers' tokens together,
    ``num_experts * sum_{k,e} (fraction of tokens whose k-th choice is e) * (mean probability of e)``.

    ``router_logits``: one ``[T, E]`` tensor per layer (or one tensor of one layer).
    ``attention_mask`` ``[batch, seq]`` (1 = real token) restricts both means to real tokens.
    ``activation="sigmoid"``: the router's per-expert sigmoid affinities take the place of the
    softmax probabilities.
    """
    if isinstance(router_logits, torch.Tensor):  # one layer, or HF's layers concatenated along the tokens
        tokens = attention_mask.numel() if attention_mask is not None else router_logits.numel() // num_experts
        router_logits = list(router_logits.reshape(-1, num_experts).split(tokens))
    stats = _summed_statistics(router_logits, num_experts, top_k, attention_mask, activation)
    return losses_from_router_statistics(stats, len(router_logits), num_experts)[0]


def router_z_loss(router_logits: torch.Tensor | Sequence[torch.Tensor]) -> torch.Tensor:
    """ST-MoE router z-loss: mean over tokens of ``logsumexp(logits)^2`` (keeps logits small)."""
    if isinstance(router_logits, torch.Tensor):
        router_logits = [router_logits]
    logits = torch.cat([t.reshape(-1, t.shape[-1]) for t in router_logits], dim=0).float()
    return torch.logsumexp(logits, dim=-1).pow(2).mean()


def sequence_balance_loss(probs: torch.Tensor, index: torch.Tensor, batch: int, num_experts: int) -> torch.Tensor:
    """DeepSeek-V3's complementary sequence-wise balance loss (paper eqs. 17-20), before its weight
    alpha, averaged over the ``batch`` sequences: per sequence of ``T`` tokens,
    ``sum_i f_i * P_i`` with ``f_i = E / (K * T) * #(tokens choosing i)`` (no gradient) and
    ``P_i = mean_t s_it / sum_j s_jt``. ``probs`` ``[batch*T, E]`` affinities, ``index`` ``[batch*T, K]``."""
    top_k = index.shape[-1]
    scores = probs.view(batch, -1, num_experts)
    seq = scores.shape[1]
    with torch.no_grad():
        chosen = F.one_hot(index.view(batch, seq, top_k), num_experts).sum((1, 2)).to(scores.dtype)  # [B, E]
        f = chosen * (num_experts / (top_k * seq))
    p = (scores / scores.sum(-1, keepdim=True)).mean(1)  # [B, E]
    return (f * p).sum(-1).mean()
