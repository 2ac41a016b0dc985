"""Cross-entropy over vocabulary-sharded logits, without gathering the full vocabulary."""

from __future__ import annotations

import torch
import torch.distributed as dist

from nxd_core_parallel import parallel_state
from nxd_core_parallel.parallel_layers import comm


def _tp_group():
    return parallel_state.get_tensor_model_parallel_group() if parallel_state.model_parallel_is_initialized() else None


def _all_reduce(t: torch.Tensor, group, op=dist.ReduceOp.SUM) -> torch.Tensor:
    return t if group is None or comm.group_size(group) == 1 else comm.all_reduce(t, group, op)


class _VocabParallelCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, target: torch.Tensor, label_smoothing: float):
        group = _tp_group()
        rank = parallel_state.get_tensor_model_parallel_rank() if group is not None else 0
        size = comm.group_size(group) if group is not None else 1
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
        vocab = per_rank * size
        if label_smoothing > 0:
            # torch's definition: target distribution (1 - eps) * onehot + eps / V.
            sum_log_probs = _all_reduce((shifted - log_sum_exp.unsqueeze(-1)).sum(dim=-1), group)
            loss = (1.0 - label_smoothing) * loss - label_smoothing * sum_log_probs / vocab
        softmax = exp / sum_exp.unsqueeze(-1)
        ctx.save_for_backward(softmax, local_target, outside)
        ctx.label_smoothing, ctx.vocab = label_smoothing, vocab
        return loss

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor):
        softmax, local_target, outside = ctx.saved_tensors
        eps = ctx.label_smoothing
        grad = softmax - eps / ctx.vocab if eps > 0 else softmax.clone()
        onehot = torch.zeros_like(grad).scatter_(-1, local_target.unsqueeze(-1), 1.0)
        onehot.masked_fill_(outside.unsqueeze(-1), 0.0)
        grad.sub_((1.0 - eps) * onehot)
        grad.mul_(grad_loss.unsqueeze(-1))
        return grad, None, None


def parallel_cross_entropy(vocab_parallel_logits: torch.Tensor, target: torch.Tensor,
                           label_smoothing: float = 0.0) -> torch.Tensor:
    """Per-token cross-entropy (unreduced, same shape as ``target``) of logits whose last
    dimension is this rank's contiguous slice of the vocabulary. Matches ``F.cross_entropy(...,
    reduction="none", label_smoothing=...)`` on the gathered logits; computed in fp32."""
    if not 0.0 <= label_smoothing < 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing}")
    if vocab_parallel_logits.shape[:-1] != target.shape:
        raise ValueError(f"logits shape {tuple(vocab_parallel_logits.shape)} does not match target shape "
                         f"{tuple(target.shape)} (expected target = logits.shape[:-1])")
    return _VocabParallelCrossEntropy.apply(vocab_parallel_logits, target, float(label_smoothing))
