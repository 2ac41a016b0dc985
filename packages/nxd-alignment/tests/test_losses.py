"""Loss values and gradients equal TRL's on the same log-probs, computed by TRL's own code.

DPO: TRL 1.16 computes the loss inline in ``DPOTrainer._compute_loss``; it is called here on a
stand-in trainer (the attributes that method reads) and a stand-in model whose per-token log-probs
carry the test's sequence log-probs, so TRL's own lines turn them into its loss. ORPO: TRL's own
``ORPOTrainer.odds_ratio_loss`` and ``get_batch_logps``."""

from __future__ import annotations

import collections
import types

import pytest
import torch
import torch.nn.functional as F

from nxd_alignment import dpo_loss, orpo_loss, reward_metrics

BETA = 0.1


def _logps(seed: int, n: int = 6) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [(-torch.rand(n, generator=g, dtype=torch.float64) * 30 - 1).requires_grad_() for _ in range(4)]


def _trl_dpo(c, r, rc, rr, beta, loss_type, lc, lr):
    """TRL 1.16's ``DPOTrainer._compute_loss`` (f_divergence_type reverse_kl, precomputed reference
    log-probs) on sequence log-probs ``c``/``r`` and completion lengths ``lc``/``lr``."""
    dpo = pytest.importorskip("trl.trainer.dpo_trainer")
    n, seq = c.shape[0], int(max(lc.max(), lr.max())) + 1
    lengths = torch.cat([lc, lr]).long()
    completion_mask = (torch.arange(seq)[None] >= 1) & (torch.arange(seq)[None] <= lengths[:, None])
    # each row's whole sequence log-prob on its first completion token, zeros after: TRL sums the row
    first = torch.zeros(2 * n, seq - 1, dtype=c.dtype)
    first[:, 0] = 1
    per_token = torch.cat([c, r])[:, None] * first
    zeros = torch.zeros(2 * n, seq - 1, dtype=c.dtype)
    model = types.SimpleNamespace(training=True)
    model_fn = lambda **kwargs: types.SimpleNamespace(  # noqa: E731
        log_probs=per_token, entropy=zeros, mean_logits=zeros, is_top1=zeros.bool())
    same = lambda x: x  # noqa: E731
    trainer = types.SimpleNamespace(
        model=model, accelerator=types.SimpleNamespace(device="cpu", gather_for_metrics=same, gather=same),
        aux_loss_enabled=False, ld_alpha=None, precompute_ref_logps=True, f_divergence_type="reverse_kl",
        loss_types=[loss_type], loss_weights=[1.0], beta=beta, use_weighting=False, label_smoothing=0.0,
        _metrics={"train": collections.defaultdict(list)}, _total_train_tokens=0, _tp_size=1)
    inputs = {"input_ids": torch.zeros(2 * n, seq, dtype=torch.long), "attention_mask": torch.ones(2 * n, seq),
              "completion_mask": completion_mask.long(), "ref_chosen_logps": rc, "ref_rejected_logps": rr}
    loss = dpo.DPOTrainer._compute_loss(trainer, model_fn, inputs, return_outputs=False)
    return loss, beta * (c - rc).detach(), beta * (r - rr).detach()


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(((a - b).abs().max() / b.abs().max().clamp(min=1e-30)).detach())


@pytest.mark.slow  # importing trl (transformers, accelerate) takes ~30 s on 2 cores
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
