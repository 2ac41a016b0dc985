"""Rotary position embedding as NxD's ``transformer_overrides`` applies it, including the layout of
NxD's flash-attention kernel (``[b, heads, head_dim, s]``)."""

from __future__ import annotations

import torch


def rotate_half(x: torch.Tensor, flash_attn: bool = False, transpose: bool = False) -> torch.Tensor:
    """``[-x2, x1]`` over the head dimension: the last one, or dim -2 in the kernel layout."""
    dim = -2 if flash_attn and transpose else -1
    x1, x2 = x.chunk(2, dim=dim)
    return torch.cat((-x2, x1), dim=dim)


def apply_rotary_pos_emb(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                         position_ids: torch.Tensor | None, flash_attn: bool, transpose_nki_inputs: bool = True
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """NxD's signature: ``cos``/``sin`` ``[b, s, d]`` (or tables indexed by ``position_ids``),
    ``q``/``k`` ``[b, heads, s, d]`` (``[b, heads, d, s]`` with ``flash_attn`` and ``transpose_nki_inputs``)."""
    if position_ids is not None:  # NxD keeps this older form for compatibility
        cos, sin = cos[position_ids], sin[position_ids]
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    if flash_attn and transpose_nki_inputs:
        cos, sin = cos.transpose(-1, -2), sin.transpose(-1, -2)
    q_embed = q * cos + rotate_half(q, flash_attn, transpose_nki_inputs) * sin
    k_embed = k * cos + rotate_half(k, flash_attn, transpose_nki_inputs) * sin
    return q_embed, k_embed
