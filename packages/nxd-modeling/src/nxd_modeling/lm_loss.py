"""Mean causal-LM cross-entropy over vocabulary-parallel logits, shared by the model packages."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from nxd.parallel import ParallelContext, dim_group, dim_size
from nxd_context_parallel import context_parallel_token_mean
from nxd_tensor_parallel import fused_kernels
from nxd_tensor_parallel.parallel_layers import parallel_cross_entropy


def supervised_tokens(labels: torch.Tensor, loss_mask: torch.Tensor | None, shape: torch.Size) -> torch.Tensor:
    """Boolean ``[batch, seq]``: tokens with ``labels != -100`` and ``loss_mask != 0``; ``labels``
    (and ``loss_mask``) must have the token ``shape`` of the logits or hidden states."""
    if labels.shape != shape:
        raise ValueError(f"labels shape {tuple(labels.shape)} must equal input_ids shape {tuple(shape)}")
    keep = labels != -100
    if loss_mask is not None:
        if loss_mask.shape != labels.shape:
            raise ValueError(f"loss_mask shape {tuple(loss_mask.shape)} must equal labels shape {tuple(labels.shape)}")
        keep = keep & (loss_mask != 0)
    return keep


def token_mean(total: torch.Tensor, count: torch.Tensor, context: ParallelContext | None) -> torch.Tensor:
    """``total / count`` over the supervised tokens; under context parallelism (of ``context``)
    over those of every CP rank (they hold parts of the same samples)."""
    if dim_size(context, "cp") > 1:
        return context_parallel_token_mean(total, count, context.cp.group)
    # An all-masked batch gives 0 (not NaN) so gradient accumulation stays finite.
    return total / count.clamp(min=1.0)


def sequence_mean(mean: torch.Tensor, tokens: int, context: ParallelContext | None) -> torch.Tensor:
    """``mean`` (over this rank's ``tokens`` tokens) as the token-weighted mean over every rank
    holding parts of the same sequences (the CP ranks of ``context``, with the loss's gradient
    convention); ``mean`` itself without context parallelism."""
    if dim_size(context, "cp") == 1:
        return mean
    count = torch.tensor(float(tokens), device=mean.device)
    return context_parallel_token_mean(mean * count, count, context.cp.group)


def causal_lm_loss(vocab_parallel_logits: torch.Tensor, labels: torch.Tensor,
                   loss_mask: torch.Tensor | None, context: ParallelContext | None) -> torch.Tensor:
    """Mean cross-entropy over tokens with ``loss_mask == 1`` and ``labels != -100``; the logits are
    sharded over ``context``'s TP ranks (``None``: no model parallelism).

    ``labels`` are already aligned with the logits (no shift here). Under context parallelism the
    mean is over the supervised tokens of every CP rank."""
    keep = supervised_tokens(labels, loss_mask, vocab_parallel_logits.shape[:-1])
    targets = labels.masked_fill(~keep, 0)
    if dim_size(context, "tp") == 1:
        # The whole vocabulary is local: torch's fused kernel, no softmax/one-hot buffers kept.
        logits = vocab_parallel_logits.float()
        per_token = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                    reduction="none").view_as(targets)
    else:
        per_token = parallel_cross_entropy(vocab_parallel_logits, targets, process_group=dim_group(context, "tp"))
    keep = keep.to(per_token.dtype)
    return token_mean((per_token * keep).sum(), keep.sum(), context)


def fused_linear_causal_lm_loss(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                                loss_mask: torch.Tensor | None, context: ParallelContext | None) -> torch.Tensor:
    """:func:`causal_lm_loss` of ``hidden @ weight.T`` through the fused linear cross-entropy
    (:mod:`nxd_tensor_parallel.fused_kernels`, CUDA): the logits never exist whole. ``weight`` holds
    the whole vocabulary (TP=1)."""
    keep = supervised_tokens(labels, loss_mask, hidden.shape[:-1])
    total = fused_kernels.linear_cross_entropy_sum(hidden, weight, labels.masked_fill(~keep, -100))
    return token_mean(total, keep.sum().to(total.dtype), context)
