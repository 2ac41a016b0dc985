"""Cross-entropy over vocabulary-sharded logits, without gathering the full vocabulary.

A logit of ``-inf`` is a class with probability zero: ``mask_vocab_padding`` gives the padded
columns of a ``pad=True`` LM head that value, so the loss, its label smoothing and every softmax of
the logits see the real vocabulary only."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from nxd_tensor_parallel.parallel_layers import comm
from nxd_tensor_parallel.parallel_layers.comm import tp_group as _tp_group


def _all_reduce(t: torch.Tensor, group, op=dist.ReduceOp.SUM) -> torch.Tensor:
    return t if comm.trivial(group) else comm.all_reduce(t, group, op)


class _VocabParallelCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, target: torch.Tensor, label_smoothing: float, group: Any):
        rank = comm.group_rank(group) if group is not None else 0
        logits = logits.float()
        logits_max = _all_reduce(logits.max(dim=-1)[0], group, dist.ReduceOp.MAX)
        shifted = logits - logits_max.unsqueeze(-1)

        per_rank = logits.size(-1)
        start = rank * per_rank
        outside = (target < start) | (target >= start + per_rank)
        local_target = (target - start).masked_fill(outside, 0)
        picked = shifted.gather(-1, local_target.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0)
        picked = _all_reduce(picked, group)

        exp = shifted.exp()
        sum_exp = _all_reduce(exp.sum(dim=-1), group)
        log_sum_exp = sum_exp.log()
        loss = log_sum_exp - picked
        valid = vocab = None
        if label_smoothing > 0:
            # torch's definition: target distribution (1 - eps) * onehot + eps / V, V the classes
            # whose logit is finite (the real vocabulary when the padding is masked to -inf).
            valid = torch.isfinite(logits)
            vocab = _all_reduce(valid.sum(dim=-1).to(logits.dtype), group)
            log_probs = (shifted - log_sum_exp.unsqueeze(-1)).masked_fill(~valid, 0.0)
            sum_log_probs = _all_reduce(log_probs.sum(dim=-1), group)
            loss = (1.0 - label_smoothing) * loss - label_smoothing * sum_log_probs / vocab
        softmax = exp / sum_exp.unsqueeze(-1)
        ctx.save_for_backward(softmax, local_target, outside, valid, vocab)
        ctx.label_smoothing = label_smoothing
        return loss

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor):
        softmax, local_target, outside, valid, vocab = ctx.saved_tensors
        eps = ctx.label_smoothing
        if eps > 0:
            grad = (softmax - (eps / vocab).unsqueeze(-1)).masked_fill_(~valid, 0.0)
        else:
            grad = softmax.clone()
        onehot = torch.zeros_like(grad).scatter_(-1, local_target.unsqueeze(-1), 1.0)
        onehot.masked_fill_(outside.unsqueeze(-1), 0.0)
        grad.sub_((1.0 - eps) * onehot)
        grad.mul_(grad_loss.unsqueeze(-1))
        return grad, None, None, None


def parallel_cross_entropy(vocab_parallel_logits: torch.Tensor, target: torch.Tensor,
                           label_smoothing: float = 0.0, process_group: Any = None) -> torch.Tensor:
    """Per-token cross-entropy (unreduced, same shape as ``target``) of logits whose last
    dimension is this rank's contiguous slice of the vocabulary over ``process_group`` (the current
    TP group when left out). Matches ``F.cross_entropy(..., reduction="none", label_smoothing=...)``
    on the gathered logits; computed in fp32."""
    if not 0.0 <= label_smoothing < 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing}")
    if vocab_parallel_logits.shape[:-1] != target.shape:
        raise ValueError(f"logits shape {tuple(vocab_parallel_logits.shape)} does not match target shape "
                         f"{tuple(target.shape)} (expected target = logits.shape[:-1])")
    return _VocabParallelCrossEntropy.apply(vocab_parallel_logits, target, float(label_smoothing),
                                            _tp_group(process_group))


def mask_vocab_padding(vocab_parallel_logits: torch.Tensor, vocab_size: int, process_group: Any = None) -> torch.Tensor:
    """This rank's slice of logits over a vocabulary padded to a multiple of the TP size of
    ``process_group`` (the current TP group when left out), with the padded classes (global index
    >= ``vocab_size``) set to ``-inf``: zero probability, no gradient. The identity when nothing is
    padded."""
    per_rank = vocab_parallel_logits.size(-1)
    group = _tp_group(process_group)
    size = comm.group_size(group) if group is not None else 1
    if per_rank * size == vocab_size:
        return vocab_parallel_logits
    if per_rank * size < vocab_size:
        raise ValueError(f"logits hold {per_rank} classes per rank x {size} ranks, fewer than vocab_size {vocab_size}")
    from nxd_tensor_parallel.vocab_padding import mask_padded_vocab  # the one rule (and why -inf)

    return mask_padded_vocab(vocab_parallel_logits, vocab_size, comm.group_rank(group) if group is not None else 0)
