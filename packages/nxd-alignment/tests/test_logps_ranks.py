"""Per-token log-prob gathering from vocabulary-sharded logits: TP=2 (2 gloo ranks) equals one
process's ``log_softmax`` + gather (and TRL's ``get_batch_logps``), values and gradients."""

from __future__ import annotations

import pytest
import torch

VOCAB, ROWS, SEQ = 64, 4, 10


def _inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(ROWS, SEQ, VOCAB, generator=g) * 3
    labels = torch.randint(0, VOCAB, (ROWS, SEQ), generator=g)
    mask = (torch.rand(ROWS, SEQ, generator=g) > 0.3).float()
    return logits, labels, mask


def _reference() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    logits, labels, mask = _inputs()
    logits.requires_grad_()
    tok = logits.log_softmax(-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1) * mask
    seq = tok.sum(-1)
    (seq * torch.arange(1, ROWS + 1)).sum().backward()
    return tok.detach(), seq.detach(), logits.grad


def _on_rank(tp: int) -> dict[str, torch.Tensor]:
    import torch.distributed as dist

    from nxd_alignment import pair_logps, per_token_logps
    from nxd_core_parallel import parallel_state as ps

    ps.initialize_model_parallel(tp)
    try:
        logits, labels, mask = _inputs()
        rank, part = ps.get_tensor_model_parallel_rank(), VOCAB // tp
        shard = logits[..., rank * part:(rank + 1) * part].clone().requires_grad_()
        tok = per_token_logps(shard, labels, mask)
        seq = tok.sum(-1)
        (seq * torch.arange(1, ROWS + 1)).sum().backward()
        grads = [torch.empty_like(shard.grad) for _ in range(tp)]
        dist.all_gather(grads, shard.grad.contiguous(), group=ps.get_tensor_model_parallel_group())
        pairs = pair_logps(tok.detach(), mask)
        return {"tok": tok.detach(), "seq": seq.detach(), "grad": torch.cat(grads, -1),
                "chosen": pairs.chosen, "rejected": pairs.rejected}
    finally:
        ps.destroy_model_parallel()


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def test_tp2_log_probs_match_one_process(rank_pool) -> None:
    ref_tok, ref_seq, ref_grad = _reference()
    results = rank_pool(2).run(_on_rank, 2)
    for got in results:
        errs = (_rel(got["tok"], ref_tok), _rel(got["seq"], ref_seq), _rel(got["grad"], ref_grad))
        print(f"TP=2 log-probs vs one process: max rel per-token {errs[0]:.1e}, per-sequence {errs[1]:.1e}, "
              f"grad {errs[2]:.1e}")
        assert max(errs) <= 1e-5
        assert torch.equal(got["chosen"], got["seq"][:2]) and torch.equal(got["rejected"], got["seq"][2:])


@pytest.mark.slow  # importing trl (transformers, accelerate) takes ~30 s on 2 cores
def test_matches_trl_get_batch_logps() -> None:
    """TRL shifts inside (logits[:, :-1] against labels[:, 1:], -100 = ignored); nxd's labels are
    already aligned, so the same pairs are compared."""
    orpo = pytest.importorskip("trl.experimental.orpo.orpo_trainer")
    from nxd_alignment import per_token_logps

    logits, labels, mask = _inputs()
    trl_labels = torch.cat([torch.full((ROWS, 1), -100), labels.masked_fill(mask == 0, -100)], dim=1)
    trl_logits = torch.cat([logits, torch.zeros(ROWS, 1, VOCAB)], dim=1)
    for average in (False, True):
        expected = orpo.ORPOTrainer.get_batch_logps(trl_logits, trl_labels, average_log_prob=average)
        tok = per_token_logps(logits, labels, mask)
        got = tok.sum(-1) / (mask.sum(-1) if average else 1)
        assert _rel(got, expected) <= 1e-6
