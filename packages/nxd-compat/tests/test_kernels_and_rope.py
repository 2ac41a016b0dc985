"""NxD's NKI attention kernel and RoPE helper on torch, against independent oracles: explicit causal
softmax attention, and transformers' ``apply_rotary_pos_emb`` (in both of NxD's layouts)."""

from __future__ import annotations

import math

import pytest
import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as hf_apply_rotary_pos_emb

from neuronx_distributed.kernels.flash_attn import nki_flash_attn_func
from neuronx_distributed.overrides.transformer_overrides import apply_rotary_pos_emb

B, H, S, D = 2, 3, 8, 4


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(torch.triu(torch.ones(S, S, dtype=torch.bool), 1), float("-inf"))
    return scores.softmax(-1) @ v


@pytest.mark.parametrize("transpose", [False, True])
def test_flash_attention_matches_causal_softmax(transpose):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, S, D, generator=g, dtype=torch.float64) for _ in range(3))
    args = [t.transpose(-1, -2) for t in (q, k, v)] if transpose else [q, k, v]  # the kernel's [b, h, d, s]
    out = nki_flash_attn_func(*args, transpose_nki_inputs=transpose)
    assert out.shape == (B, H, S, D)
    torch.testing.assert_close(out, causal_attention(q, k, v), rtol=1e-12, atol=1e-12)


def test_flash_attention_without_the_layout_argument_reads_it_as_each_release_did():
    # NxD <= 2.22 had no transpose_nki_inputs ([b, h, s, d]); >= 2.23 defaults it to True ([b, h, d, s]);
    # the kernel's 2048-token sequences tell the two calls apart
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, 2048, 2, generator=g, dtype=torch.float64) for _ in range(3))
    reference = nki_flash_attn_func(q, k, v, transpose_nki_inputs=False)
    torch.testing.assert_close(nki_flash_attn_func(q, k, v), reference, rtol=0, atol=0)
    kernel_layout = [t.transpose(-1, -2) for t in (q, k, v)]
    torch.testing.assert_close(nki_flash_attn_func(*kernel_layout), reference, rtol=0, atol=0)
    small = torch.randn(B, H, S, D)
    with pytest.raises(ValueError, match=r"without transpose_nki_inputs on q of shape \(2, 3, 8, 4\)"):
        nki_flash_attn_func(small, small, small)


def test_flash_attention_refuses_dropout():
    q = torch.randn(1, 1, S, D)
    with pytest.raises(NotImplementedError, match="dropout"):
        nki_flash_attn_func(q, q, q, dropout_p=0.1, transpose_nki_inputs=False)


@pytest.mark.parametrize("flash_layout", [False, True])
def test_rotary_matches_transformers(flash_layout):
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(B, H, S, D, generator=g), torch.randn(B, H, S, D, generator=g)
    angles = torch.randn(B, S, D // 2, generator=g)
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    ref_q, ref_k = hf_apply_rotary_pos_emb(q, k, cos, sin)
    if flash_layout:  # NxD's kernel layout [b, h, d, s] in and out
        out_q, out_k = apply_rotary_pos_emb(q.transpose(-1, -2), k.transpose(-1, -2), cos, sin, None, True, True)
        out_q, out_k = out_q.transpose(-1, -2), out_k.transpose(-1, -2)
    else:
        out_q, out_k = apply_rotary_pos_emb(q, k, cos, sin, None, False)
    torch.testing.assert_close(out_q, ref_q)
    torch.testing.assert_close(out_k, ref_k)
