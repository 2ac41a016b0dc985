"""Turn the ``attention_mask`` a batch carries into the boolean mask SDPA takes (every model
family's attention: Llama and its descendants, GPT).

Accepted forms (always combined with causality):

* ``None``: plain causal attention (SDPA's fused ``is_causal`` path, no mask tensor built).
* ``[batch, keys]`` integers or bools: ``0`` marks padding; any other value is a segment id, and a
  token attends only to earlier tokens of its own segment. A Hugging Face 0/1 padding mask is the
  one-segment case; packed SFT batches pass per-example segment ids (1, 1, 2, 2, 2, 3, ...).
* ``[batch, queries, keys]`` or ``[batch, 1, queries, keys]``: explicit mask, True/nonzero = may
  attend (e.g. a block-diagonal mask for packed sequences).

``keys`` is ``past + seq`` when a KV cache holds ``past`` earlier positions (or ``seq``: then the
cached positions are all visible). A query row that would see nothing sees itself, so padded rows
give finite values instead of NaN.
"""

from __future__ import annotations

import torch


def build_attention_mask(attention_mask: torch.Tensor | None, batch: int, seq: int, device: torch.device,
                         past: int = 0) -> torch.Tensor | None:
    """``None`` (plain causal) or a bool mask ``[batch, 1, seq, past + seq]``."""
    keys = past + seq
    if attention_mask is None:
        if past == 0 or seq == 1:
            return None
        return _causal(seq, past, device)[None, None].expand(batch, 1, seq, keys)
    m = attention_mask.to(device)
    if m.dim() == 2:
        if m.shape == (batch, seq) and past:
            m = torch.cat([torch.ones(batch, past, dtype=m.dtype, device=device), m], dim=1)
        if m.shape != (batch, keys):
            raise ValueError(f"attention_mask of shape {tuple(attention_mask.shape)} does not match the batch: "
                             f"expected [batch={batch}, {keys}]")
        seg = m.long()
        seg_q = seg[:, past:]
        allowed = (seg_q[:, :, None] == seg[:, None, :]) & (seg[:, None, :] != 0)
        allowed = allowed[:, None]
    elif m.dim() in (3, 4):
        if m.dim() == 3:
            m = m[:, None]
        if m.shape[0] != batch or m.shape[2:] != (seq, keys):
            raise ValueError(f"attention_mask of shape {tuple(attention_mask.shape)} does not match the batch: "
                             f"expected [batch={batch}, (1,) {seq}, {keys}]")
        allowed = m != 0
    else:
        raise ValueError(f"attention_mask must have 2, 3 or 4 dimensions, got shape {tuple(attention_mask.shape)}")
    allowed = allowed & _causal(seq, past, device)
    diagonal = torch.zeros(seq, keys, dtype=torch.bool, device=device)
    diagonal[torch.arange(seq), torch.arange(past, keys)] = True
    return allowed | diagonal


def sliding_window_mask(mask: torch.Tensor | None, batch: int, seq: int, past: int, window: int | None,
                        device: torch.device) -> torch.Tensor | None:
    """AND Hugging Face's sliding window (query ``i`` sees keys ``j`` with ``i - j < window``; Mistral,
    Mixtral) into ``mask`` from :func:`build_attention_mask` (``None`` = plain causal); ``None``
    again when the window hides nothing."""
    if window is None or past + seq <= window:
        return mask
    q = torch.arange(past, past + seq, device=device)[:, None]
    k = torch.arange(past + seq, device=device)[None, :]
    allowed = (k <= q) & (q - k < window)
    if mask is None:
        return allowed[None, None].expand(batch, 1, seq, past + seq)
    return mask & allowed


def _causal(seq: int, past: int, device: torch.device) -> torch.Tensor:
    return torch.ones(seq, past + seq, dtype=torch.bool, device=device).tril(diagonal=past)
