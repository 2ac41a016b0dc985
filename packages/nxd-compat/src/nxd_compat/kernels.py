"""NxD's NKI attention kernels, computed with torch: flash attention on SDPA, ring attention on nxd's
context-parallel ring."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F


def _check_dropout(dropout_p: float, seed: Any) -> None:
    if dropout_p:
        raise NotImplementedError(f"attention dropout (dropout_p={dropout_p}) with NxD's kernel RNG is not provided by "
                                  "nxd-compat; use dropout_p=0.0")


#: NxD's flash-attention kernel takes sequences in multiples of this many tokens
KERNEL_SEQUENCE_BLOCK = 2048


def _transposed_layout(q: torch.Tensor) -> bool:
    """Whether a call that does not pass ``transpose_nki_inputs`` gives the kernel's ``[b, h, d, s]``.
    NxD >= 2.23 reads such a call as ``[b, h, d, s]`` (its default True), NxD <= 2.22 (no such
    argument) as ``[b, h, s, d]``; the Llama example of 2.22 calls it that way. On Neuron the sequence
    is a multiple of 2048 (the kernel refuses any other), which tells the two apart; without that,
    choosing one would compute some other attention without a word."""
    last, third = (q.shape[-1] % KERNEL_SEQUENCE_BLOCK == 0), (q.shape[-2] % KERNEL_SEQUENCE_BLOCK == 0)
    if last != third:
        return last
    raise ValueError(f"nki_flash_attn_func was called without transpose_nki_inputs on q of shape {tuple(q.shape)}: "
                     "NxD >= 2.23 reads that as [b, heads, d, s] (its default True), NxD <= 2.22 as [b, heads, s, d]; "
                     f"a sequence that is a multiple of {KERNEL_SEQUENCE_BLOCK} (as NxD's kernel needs) tells them "
                     "apart, this shape does not: pass transpose_nki_inputs=True or False")


def nki_flash_attn_func(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lnc: int = 1, dropout_p: float = 0.0,
                        softmax_scale: float | None = None, causal: bool = True, mixed_precision: bool = True,
                        seed: Any = None, hardware_type: Any = None,
                        transpose_nki_inputs: bool | None = None) -> torch.Tensor:
    """NxD's flash attention: ``q``/``k``/``v`` ``[b, heads, s, d]``, or ``[b, heads, d, s]`` with
    ``transpose_nki_inputs`` (the kernel's layout); returns ``[b, heads, s, d]``. ``mixed_precision``
    keeps the softmax in fp32 as the kernel does. Not passing ``transpose_nki_inputs`` is read as
    the release that called it meant it (:func:`_transposed_layout`)."""
    _check_dropout(dropout_p, seed)
    if transpose_nki_inputs is None:
        transpose_nki_inputs = _transposed_layout(q)
    if transpose_nki_inputs:
        q, k, v = (t.transpose(-1, -2) for t in (q, k, v))
    dtype = q.dtype
    if mixed_precision and dtype in (torch.bfloat16, torch.float16):
        q, k, v = q.float(), k.float(), v.float()
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=softmax_scale)
    return out.to(dtype)


def nki_ring_attn_func(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rank_id: int, src_tgt_pairs: Any,
                       dropout_p: float = 0.0, softmax_scale: float | None = None, causal: bool = True,
                       mixed_precision: bool = True, seed: Any = None) -> torch.Tensor:
    """NxD's ring attention over the context-parallel group: ``q``/``k``/``v`` ``[b, heads, local_s, d]``
    hold this CP rank's contiguous slice of the sequence (NxD's ``get_batch_on_this_context_parallel_rank``);
    returns ``[b, heads, local_s, d]``. ``rank_id`` / ``src_tgt_pairs`` describe the same ring nxd builds
    from the CP group."""
    _check_dropout(dropout_p, seed)
    from neuronx_distributed.parallel_layers import parallel_state
    from nxd_context_parallel import ring_attention

    return ring_attention(q, k, v, parallel_state.get_context_model_parallel_group(), causal=causal,
                          load_balance=False, scale=softmax_scale)
