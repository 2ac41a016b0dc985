"""Rotary position embeddings: plain, linear-scaled and Llama 3.1 (``llama3``) frequency scaling."""

from __future__ import annotations

import math

import torch

from nxd_models_llama.config import LlamaConfig


def rope_inv_freq(config: LlamaConfig) -> torch.Tensor:
    """Inverse frequencies (``head_dim // 2`` values, fp32) for ``config``'s RoPE variant."""
    dim = config.head_dim
    # Explicitly on CPU: models may be built under `with torch.device("meta")`.
    steps = torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").float()
    inv_freq = 1.0 / (config.rope_theta ** (steps / dim))
    rope_type = config.rope_type
    if rope_type == "default":
        return inv_freq
    scaling = config.rope_scaling or {}
    factor = float(scaling["factor"])
    if rope_type == "linear":
        return inv_freq / factor
    # llama3: long wavelengths are slowed by `factor`, short ones kept, the band between blended.
    low = float(scaling["low_freq_factor"])
    high = float(scaling["high_freq_factor"])
    old_context = float(scaling["original_max_position_embeddings"])
    low_freq_wavelen = old_context / low
    high_freq_wavelen = old_context / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding(torch.nn.Module):
    """``(cos, sin)`` of shape ``[batch, seq, head_dim]`` for given ``position_ids``.

    The frequencies are derived from the config, so they are neither a parameter nor a buffer:
    meta-device init, materialisation and checkpoints never see them."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        self._inv_freq = {torch.device("cpu"): rope_inv_freq(config)}

    def inv_freq(self, device: torch.device) -> torch.Tensor:
        if device not in self._inv_freq:
            self._inv_freq[device] = self._inv_freq[torch.device("cpu")].to(device)
        return self._inv_freq[device]

    def forward(self, position_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        # fp32 angles regardless of the model dtype: bf16 positions lose precision past 256.
        inv_freq = self.inv_freq(position_ids.device)
        freqs = position_ids[:, :, None].float() * inv_freq[None, None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` of shape ``[batch, heads, seq, head_dim]`` (Hugging Face's half-split layout)."""
    cos = cos.unsqueeze(1)
    sin = sin.unsqueeze(1)
    return x * cos + _rotate_half(x) * sin
