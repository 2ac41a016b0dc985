"""Preference losses on sequence log-probabilities, as TRL defines them.

* DPO (``trl.DPOTrainer``, reverse-KL): with ``delta = (pi_c - ref_c) - (pi_r - ref_r)`` over summed
  response log-probs, ``sigmoid``: ``-logsigmoid(beta * delta)``; ``hinge``: ``relu(1 - beta * delta)``;
  ``ipo``: ``(delta_avg - 1 / (2 * beta))**2`` where each log-ratio is divided by its response
  length. Rewards are ``beta * (pi - ref)``.
* ORPO (``trl.experimental.orpo.ORPOTrainer``): on length-averaged log-probs,
  ``log_odds = (pi_c - pi_r) - (log1mexp(pi_c) - log1mexp(pi_r))``, loss ``nll_chosen -
  beta * mean(logsigmoid(log_odds))``; rewards ``beta * pi``.

Each function returns the batch-mean loss and detached per-pair tensors for the metrics.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

DPO_LOSS_TYPES = ("sigmoid", "hinge", "ipo")


@dataclass
class PreferenceLoss:
    loss: torch.Tensor
    chosen_rewards: torch.Tensor
    rejected_rewards: torch.Tensor


def dpo_loss(
    chosen_logps: torch.Tensor, rejected_logps: torch.Tensor, ref_chosen_logps: torch.Tensor,
    ref_rejected_logps: torch.Tensor, *, beta: float, loss_type: str = "sigmoid",
    chosen_lengths: torch.Tensor | None = None, rejected_lengths: torch.Tensor | None = None,
) -> PreferenceLoss:
    """DPO on summed response log-probs ``[pairs]``; ``ipo`` also needs the response lengths."""
    chosen_ratio = chosen_logps - ref_chosen_logps
    rejected_ratio = rejected_logps - ref_rejected_logps
    if loss_type == "sigmoid":
        losses = -F.logsigmoid(beta * (chosen_ratio - rejected_ratio))
    elif loss_type == "hinge":
        losses = torch.relu(1 - beta * (chosen_ratio - rejected_ratio))
    elif loss_type == "ipo":
        if chosen_lengths is None or rejected_lengths is None:
            raise ValueError("the ipo loss needs chosen_lengths and rejected_lengths (response token counts)")
        delta = chosen_ratio / chosen_lengths.clamp(min=1) - rejected_ratio / rejected_lengths.clamp(min=1)
        losses = (delta - 1 / (2 * beta)) ** 2
    else:
        raise ValueError(f"unknown DPO loss_type {loss_type!r}; valid: {', '.join(DPO_LOSS_TYPES)}")
    return PreferenceLoss(losses.mean(), beta * chosen_ratio.detach(), beta * rejected_ratio.detach())


def log1mexp(x: torch.Tensor) -> torch.Tensor:
    """``log(1 - exp(x))`` for ``x < 0``, stable on both sides of ``-ln 2``."""
    return torch.where(x < -0.6931471805599453, torch.log1p(-torch.exp(x)), torch.log(-torch.expm1(x)))


def orpo_loss(chosen_avg_logps: torch.Tensor, rejected_avg_logps: torch.Tensor, chosen_nll: torch.Tensor, *,
              beta: float) -> tuple[PreferenceLoss, torch.Tensor]:
    """ORPO from length-averaged log-probs ``[pairs]`` and the chosen NLL (a scalar); also returns
    the log-odds ``[pairs]`` (detached) for logging."""
    c, r = chosen_avg_logps.float(), rejected_avg_logps.float()
    log_odds = (c - r) - (log1mexp(c) - log1mexp(r))
    ratio = F.logsigmoid(log_odds)
    loss = chosen_nll - (beta * ratio).mean()
    return PreferenceLoss(loss, beta * c.detach(), beta * r.detach()), log_odds.detach()


def reward_metrics(result: PreferenceLoss) -> dict[str, torch.Tensor]:
    """TRL's names: rewards/chosen, rewards/rejected, rewards/accuracies, rewards/margins (batch means)."""
    c, r = result.chosen_rewards, result.rejected_rewards
    return {"rewards/chosen": c.mean(), "rewards/rejected": r.mean(),
            "rewards/accuracies": (c > r).float().mean(), "rewards/margins": (c - r).mean()}
