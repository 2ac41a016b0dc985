"""Per-token and per-sequence log-probabilities from (vocabulary-sharded) logits.

The model's ``.logits`` are this tensor-parallel rank's slice of the vocabulary (the ModelSpec
contract); nxd-tensor-parallel's vocab-parallel cross-entropy gives ``-log p(label)`` without
gathering the vocabulary, with its backward, so ``log p = -cross_entropy``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nxd_tensor_parallel.parallel_layers.loss_functions import parallel_cross_entropy


def per_token_logps(vocab_parallel_logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``log p(labels)`` ``[rows, seq]`` (fp32), 0 where ``mask`` is 0. ``labels`` are aligned
    with the logits (position ``j`` predicts ``labels[:, j]``)."""
    keep = mask != 0
    return -parallel_cross_entropy(vocab_parallel_logits, labels.masked_fill(~keep, 0)) * keep


@dataclass
class PairLogps:
    """Chosen/rejected halves of a ``[2m, seq]`` batch: summed log-probs and response lengths."""

    chosen: torch.Tensor
    rejected: torch.Tensor
    chosen_lengths: torch.Tensor
    rejected_lengths: torch.Tensor

    def averaged(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.chosen / self.chosen_lengths.clamp(min=1), self.rejected / self.rejected_lengths.clamp(min=1)


def pair_logps(token_logps: torch.Tensor, loss_mask: torch.Tensor) -> PairLogps:
    sums, lengths = token_logps.sum(-1), (loss_mask != 0).sum(-1).to(token_logps.dtype)
    m = sums.shape[0] // 2
    return PairLogps(sums[:m], sums[m:], lengths[:m], lengths[m:])


def forward_logits(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The model's vocab-parallel logits for a preference batch. Rows are right-padded, so causal
    attention alone keeps padding out of every real token's context."""
    return model(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).logits
