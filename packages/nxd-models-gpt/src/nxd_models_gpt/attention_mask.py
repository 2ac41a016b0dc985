"""The batch's ``attention_mask`` as the boolean mask SDPA takes (always combined with causality).

* ``None``: plain causal attention (SDPA's ``is_causal`` path, no mask tensor).
* ``[batch, seq]`` integers/bools: ``0`` marks padding, other values are segment ids (packed
  examples): a token attends to earlier tokens of its own segment.
* ``[batch, seq, seq]`` or ``[batch, 1, seq, seq]``: explicit, True/nonzero = may attend.

A query row that would see nothing sees itself, so padded rows stay finite.
"""

from __future__ import annotations

import torch


def build_attention_mask(attention_mask: torch.Tensor | None, batch: int, seq: int,
                         device: torch.device) -> torch.Tensor | None:
    if attention_mask is None:
        return None
    m = attention_mask.to(device)
    if m.dim() == 2:
        if m.shape != (batch, seq):
            raise ValueError(f"attention_mask of shape {tuple(m.shape)} does not match the batch [{batch}, {seq}]")
        seg = m.long()
        allowed = ((seg[:, :, None] == seg[:, None, :]) & (seg[:, None, :] != 0))[:, None]
    elif m.dim() in (3, 4):
        if m.dim() == 3:
            m = m[:, None]
        if m.shape[0] != batch or m.shape[2:] != (seq, seq):
            raise ValueError(f"attention_mask of shape {tuple(attention_mask.shape)} does not match the batch: "
                             f"expected [{batch}, (1,) {seq}, {seq}]")
        allowed = m != 0
    else:
        raise ValueError(f"attention_mask must have 2, 3 or 4 dimensions, got shape {tuple(attention_mask.shape)}")
    causal = torch.ones(seq, seq, dtype=torch.bool, device=device).tril()
    return (allowed & causal) | torch.eye(seq, dtype=torch.bool, device=device)
