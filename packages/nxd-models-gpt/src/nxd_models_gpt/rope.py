"""Rotary position embeddings on the first ``rotary_dim`` channels of each head (Megatron's
``rotary_percentage``, GPT-NeoX's ``rotary_pct``), rotate-half (non-interleaved) convention: the
shared implementation, :mod:`nxd_core_parallel.modules.rotary`."""

from __future__ import annotations

from nxd_core_parallel.modules.rotary import RotaryEmbedding, apply_rotary

__all__ = ["RotaryEmbedding", "apply_rotary"]
