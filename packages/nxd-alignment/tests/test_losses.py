"""Loss values and gradients equal TRL's definitions on the same log-probs.

DPO: TRL 1.16 computes the loss inline in ``DPOTrainer._compute_loss``; its formulas are written
out below (independently of nxd_alignment). ORPO: TRL's own ``ORPOTrainer.odds_ratio_loss`` and
``get_batch_logps`` are called when trl is installed."""

from __future__ import annotations

import types

import pytest
import torch
import torch.nn.functional as F

from nxd_alignment import dpo_loss, orpo_loss, reward_metrics

BETA = 0.1


def _logps(seed: int, n: int = 6) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [(-torch.rand(n, generator=g, dtype=torch.float64) * 30 - 1).requires_grad_() for _ in range(4)]


def _trl_dpo(c, r, rc, rr, beta, loss_type, lc=None, lr=None):
    """trl/trainer/dpo_trainer.py (1.16.0), f_divergence_type reverse_kl."""
    chosen_scores, rejected_scores = c - rc, r - rr
    delta = chosen_scores - rejected_scores
    if loss_type == "sigmoid":
        per = -F.logsigmoid(beta * delta)
    elif loss_type == "hinge":
        per = torch.relu(1 - beta * delta)
    else:  # ipo: length-normalised scores
        per = (chosen_scores / lc.clamp(min=1.0) - rejected_scores / lr.clamp(min=1.0) - 1 / (2 * beta)) ** 2
    return per.mean(), beta * chosen_scores.detach(), beta * rejected_scores.detach()


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-30))


@pytest.mark.parametrize("loss_type", ["sigmoid", "hinge", "ipo"])
def test_dpo_matches_trl(loss_type: str) -> None:
    c, r, rc, rr = _logps(1)
    lc, lr = torch.tensor([3.0, 5, 1, 8, 2, 4], dtype=torch.float64), torch.tensor([4.0, 2, 6, 1, 3, 7], dtype=torch.float64)
    ours = dpo_loss(c, r, rc, rr, beta=BETA, loss_type=loss_type, chosen_lengths=lc, rejected_lengths=lr)
    ours_grads = torch.autograd.grad(ours.loss, [c, r])
    ref_loss, ref_c, ref_r = _trl_dpo(c, r, rc, rr, BETA, loss_type, lc, lr)
    ref_grads = torch.autograd.grad(ref_loss, [c, r])
    print(f"DPO {loss_type}: loss {ours.loss.item():.6f}, rel diff {_rel(ours.loss, ref_loss):.1e}")
    assert _rel(ours.loss, ref_loss) <= 1e-12
    for a, b in zip(ours_grads, ref_grads):
        assert _rel(a, b) <= 1e-12
    assert torch.equal(ours.chosen_rewards, ref_c) and torch.equal(ours.rejected_rewards, ref_r)
    m = reward_metrics(ours)
    assert float(m["rewards/accuracies"]) == pytest.approx(float((ref_c > ref_r).double().mean()), rel=1e-6)
    assert float(m["rewards/margins"]) == pytest.approx(float((ref_c - ref_r).mean()), rel=1e-12)


def test_dpo_rejects_unknown_loss_type() -> None:
    c, r, rc, rr = _logps(2)
    with pytest.raises(ValueError, match="valid: sigmoid, hinge, ipo"):
        dpo_loss(c, r, rc, rr, beta=BETA, loss_type="kto")


def _orpo_formula(c, r, nll, beta):
    """ORPO paper eqs. (4), (7) as TRL writes them (log1p(-exp) branch only: c, r < -ln 2 here)."""
    log_odds = (c - r) - (torch.log1p(-torch.exp(c)) - torch.log1p(-torch.exp(r)))
    return nll - beta * F.logsigmoid(log_odds).mean()


@pytest.mark.slow  # importing trl (transformers, accelerate) takes ~30 s on 2 cores
def test_orpo_matches_formula_and_trl() -> None:
    c, r, _, _ = [x / 10 for x in _logps(3)]  # length-averaged log-probs are small negatives
    c, r = c.detach().float().requires_grad_(), r.detach().float().requires_grad_()
    nll = torch.tensor(1.7, requires_grad=True)
    result, _ = orpo_loss(c, r, nll, beta=BETA)
    grads = torch.autograd.grad(result.loss, [c, r, nll])
    ref = _orpo_formula(c, r, nll, BETA)
    ref_grads = torch.autograd.grad(ref, [c, r, nll])
    assert _rel(result.loss, ref) <= 1e-6
    for a, b in zip(grads, ref_grads):
        assert _rel(a, b) <= 1e-5
    trl_orpo = pytest.importorskip("trl.experimental.orpo.orpo_trainer")
    fake = types.SimpleNamespace(beta=BETA, accelerator=types.SimpleNamespace(device="cpu"))
    losses, chosen_rewards, rejected_rewards, _, _ = trl_orpo.ORPOTrainer.odds_ratio_loss(fake, c, r)
    trl_loss = nll - losses.mean()
    trl_grads = torch.autograd.grad(trl_loss, [c, r, nll])
    rel = _rel(result.loss, trl_loss)
    print(f"ORPO vs trl.ORPOTrainer.odds_ratio_loss: loss {result.loss.item():.6f}, rel diff {rel:.1e}")
    assert rel <= 1e-6
    for a, b in zip(grads, trl_grads):
        assert _rel(a, b) <= 1e-5
    assert torch.equal(result.chosen_rewards, chosen_rewards) and torch.equal(result.rejected_rewards, rejected_rewards)


def test_orpo_near_zero_logps_is_finite() -> None:
    """log1mexp's second branch: average log-probs close to 0 (a near-certain response)."""
    c = torch.tensor([-1e-4, -0.3], requires_grad=True)
    r = torch.tensor([-0.5, -2.0], requires_grad=True)
    result, _ = orpo_loss(c, r, torch.tensor(0.0), beta=1.0)
    result.loss.backward()
    assert torch.isfinite(result.loss) and torch.isfinite(c.grad).all()
