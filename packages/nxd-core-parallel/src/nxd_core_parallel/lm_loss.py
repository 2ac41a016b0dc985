"""Mean causal-LM cross-entropy over vocabulary-parallel logits, shared by the model packages."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from nxd_core_parallel import parallel_state
from nxd_core_parallel.context_parallel import context_parallel_token_mean
from nxd_core_parallel.parallel_layers import parallel_cross_entropy


def _context_parallel_size() -> int:
    return parallel_state.get_context_model_parallel_size() if parallel_state.model_parallel_is_initialized() else 1


def causal_lm_loss(vocab_parallel_logits: torch.Tensor, labels: torch.Tensor,
                   loss_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Mean cross-entropy over tokens with ``loss_mask == 1`` and ``labels != -100``.

    ``labels`` are already aligned with the logits (no shift here). Under context parallelism the
    mean is over the supervised tokens of every CP rank."""
    if labels.shape != vocab_parallel_logits.shape[:-1]:
        raise ValueError(f"labels shape {tuple(labels.shape)} must equal input_ids shape "
                         f"{tuple(vocab_parallel_logits.shape[:-1])}")
    keep = labels != -100
    if loss_mask is not None:
        if loss_mask.shape != labels.shape:
            raise ValueError(f"loss_mask shape {tuple(loss_mask.shape)} must equal labels shape {tuple(labels.shape)}")
        keep = keep & (loss_mask != 0)
    targets = labels.masked_fill(~keep, 0)
    if parallel_state.get_tensor_model_parallel_size() == 1:
        # The whole vocabulary is local: torch's fused kernel, no softmax/one-hot buffers kept.
        logits = vocab_parallel_logits.float()
        per_token = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                    reduction="none").view_as(targets)
    else:
        per_token = parallel_cross_entropy(vocab_parallel_logits, targets)
    keep = keep.to(per_token.dtype)
    if _context_parallel_size() > 1:
        # the mean over the supervised tokens of every CP rank (they hold parts of the same samples)
        return context_parallel_token_mean((per_token * keep).sum(), keep.sum(),
                                           parallel_state.get_context_model_parallel_group())
    # An all-masked batch gives 0 (not NaN) so gradient accumulation stays finite.
    return (per_token * keep).sum() / keep.sum().clamp(min=1.0)
