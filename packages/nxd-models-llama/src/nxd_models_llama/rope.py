"""A Llama-shaped config's rotary embedding: the shared implementation
(:mod:`nxd_core_parallel.modules.rotary`: plain, ``linear``, ``llama3`` and ``yarn`` scaling) read
from the config's ``head_dim``, ``rope_theta``, ``rope_scaling`` and ``max_position_embeddings``."""

from __future__ import annotations

import torch

from nxd_core_parallel.modules import rotary
from nxd_core_parallel.modules.rotary import apply_rotary
from nxd_models_llama.config import LlamaConfig

__all__ = ["RotaryEmbedding", "apply_rotary", "rope_inv_freq"]


def rope_inv_freq(config: LlamaConfig) -> torch.Tensor:
    """Inverse frequencies (``head_dim // 2`` values, fp32) for ``config``'s RoPE variant."""
    return rotary.rope_frequencies(config.head_dim, config.rope_theta, config.rope_scaling,
                                   config.max_position_embeddings)[0]


class RotaryEmbedding(rotary.RotaryEmbedding):
    """``(cos, sin)`` of shape ``[batch, seq, head_dim]`` for given ``position_ids`` (YaRN's
    attention factor applied to both, as transformers does)."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__(config.head_dim, config.rope_theta, config.rope_scaling, config.max_position_embeddings)
        self.config = config
