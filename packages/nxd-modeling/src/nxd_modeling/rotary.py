"""Rotary position embeddings, the one implementation every family uses: the frequencies of each
Hugging Face ``rope_type`` nxd builds (plain, ``linear``, ``llama3``, ``yarn``; computed as
transformers' ``modeling_rope_utils`` computes them), their validation, the rotation itself, and
NxD's ``transformer_overrides`` form of it (including the layout of NxD's flash-attention kernel,
``[b, heads, head_dim, s]``)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from nxd.errors import ConfigError

#: RoPE variants nxd implements (Hugging Face ``rope_type`` names) -> the keys each requires
REQUIRED_KEYS: dict[str, tuple[str, ...]] = {
    "default": (),
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "yarn": ("factor",),
}
ROPE_TYPES = tuple(REQUIRED_KEYS)
#: ... and the optional ones (transformers' ``_validate_*_rope_parameters``)
_OPTIONAL_KEYS: dict[str, tuple[str, ...]] = {
    "yarn": ("original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow", "mscale",
             "mscale_all_dim", "truncate"),
}
#: keys any variant may carry: its name (``type`` is transformers 4's spelling) and the base
_COMMON_KEYS = ("rope_type", "type", "rope_theta")


def rope_type_of(scaling: Mapping[str, Any] | None) -> str:
    """The ``rope_type`` of a ``rope_scaling`` dict (``type`` in older configs; ``default`` when none)."""
    if not scaling:
        return "default"
    return scaling.get("rope_type", scaling.get("type", "default"))


def validate_rope_scaling(scaling: Any, family: str) -> None:
    """Refuse a ``rope_scaling`` nxd does not compute exactly as transformers does, naming the
    model ``family`` whose config holds it, the key and the reason."""
    if scaling is None:
        return
    if not isinstance(scaling, Mapping):
        raise ConfigError(f"{family} config: rope_scaling must be a dict or null, got {scaling!r}")
    rope_type = rope_type_of(scaling)
    if rope_type not in REQUIRED_KEYS:
        raise ConfigError(f"{family} config: rope_scaling.rope_type {rope_type!r} is not supported; "
                          f"valid: {list(ROPE_TYPES)}")
    for key in REQUIRED_KEYS[rope_type]:
        if scaling.get(key) is None:
            raise ConfigError(f"{family} config: rope_scaling of type {rope_type!r} needs key {key!r}")
    known = set(_COMMON_KEYS) | set(REQUIRED_KEYS[rope_type]) | set(_OPTIONAL_KEYS.get(rope_type, ()))
    unknown = sorted(set(scaling) - known)
    if unknown:
        raise ConfigError(f"{family} config: rope_scaling keys {unknown} are not part of rope_type {rope_type!r} "
                          f"(it takes {sorted(known - set(_COMMON_KEYS))})")
    for key in ("factor", "attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim"):
        value = scaling.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0):
            raise ConfigError(f"{family} config: rope_scaling.{key} must be a non-negative number, got {value!r}")


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's magnitude correction ``0.1 * mscale * ln(scale) + 1`` (1 for ``scale <= 1``)."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def yarn_softmax_scale(scaling: Mapping[str, Any] | None) -> float:
    """The extra softmax scale DeepSeek's attention applies with YaRN (transformers'
    ``yarn_apply_mscale``): ``yarn_mscale(factor, mscale_all_dim) ** 2`` when ``mscale_all_dim`` is set, else 1."""
    if rope_type_of(scaling) == "default" or not scaling.get("mscale_all_dim"):
        return 1.0
    return yarn_mscale(float(scaling["factor"]), float(scaling["mscale_all_dim"])) ** 2


def _yarn(pos_freqs: torch.Tensor, dim: int, base: float, scaling: Mapping[str, Any],
          max_position_embeddings: int) -> tuple[torch.Tensor, float]:
    """transformers' ``_compute_yarn_parameters``: interpolated (``/ factor``) low frequencies,
    extrapolated (kept) high ones, a linear ramp between the ``beta_fast``/``beta_slow`` rotation
    counts over the original context; cos/sin scaled by the attention factor."""
    factor = float(scaling["factor"])
    old_context = scaling.get("original_max_position_embeddings") or max_position_embeddings
    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all_dim = scaling.get("mscale"), scaling.get("mscale_all_dim")
        if mscale and mscale_all_dim:
            attention_factor = yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)
        else:
            attention_factor = yarn_mscale(factor)
    beta_fast, beta_slow = scaling.get("beta_fast") or 32, scaling.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(old_context / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32, device="cpu") - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp
    interpolated = 1.0 / (factor * pos_freqs)
    return interpolated * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation, float(attention_factor)


def rope_frequencies(head_dim: int, rope_theta: float, scaling: Mapping[str, Any] | None = None,
                     max_position_embeddings: int | None = None) -> tuple[torch.Tensor, float]:
    """``(inv_freq, attention_factor)``: the ``head_dim // 2`` inverse frequencies (fp32, CPU) of
    the ``rope_scaling`` variant and the factor cos/sin are multiplied by (1 except for YaRN)."""
    # Explicitly on CPU: models may be built under `with torch.device("meta")`.
    steps = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float()
    pos_freqs = rope_theta ** (steps / head_dim)
    inv_freq = 1.0 / pos_freqs
    rope_type = rope_type_of(scaling)
    if rope_type == "default":
        return inv_freq, 1.0
    if rope_type == "yarn":
        return _yarn(pos_freqs, head_dim, rope_theta, scaling, max_position_embeddings or 0)
    factor = float(scaling["factor"])
    if rope_type == "linear":
        return inv_freq / factor, 1.0
    # llama3: long wavelengths are slowed by `factor`, short ones kept, the band between blended.
    low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    old_context = float(scaling["original_max_position_embeddings"])
    low_freq_wavelen, high_freq_wavelen = old_context / low, old_context / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled), 1.0


class RotaryEmbedding(torch.nn.Module):
    """``(cos, sin)`` of shape ``[batch, seq, dim]`` for ``position_ids`` ``[batch, seq]``.

    The frequencies are derived from the config, so they are neither a parameter nor a buffer:
    meta-device init, materialisation and checkpoints never see them."""

    def __init__(self, dim: int, rope_theta: float = 10000.0, scaling: Mapping[str, Any] | None = None,
                 max_position_embeddings: int | None = None) -> None:
        super().__init__()
        inv_freq, self.attention_factor = rope_frequencies(dim, rope_theta, scaling, max_position_embeddings)
        self._inv_freq = {torch.device("cpu"): inv_freq}

    def inv_freq(self, device: torch.device) -> torch.Tensor:
        if device not in self._inv_freq:
            self._inv_freq[device] = self._inv_freq[torch.device("cpu")].to(device)
        return self._inv_freq[device]

    def forward(self, position_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        # fp32 angles regardless of the model dtype: bf16 positions lose precision past 256.
        inv_freq = self.inv_freq(position_ids.device)
        freqs = position_ids[:, :, None].float() * inv_freq[None, None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        if self.attention_factor != 1.0:
            cos, sin = cos * self.attention_factor, sin * self.attention_factor
        return cos.to(dtype), sin.to(dtype)


def rotate_half(x: torch.Tensor, flash_attn: bool = False, transpose: bool = False) -> torch.Tensor:
    """``[-x2, x1]`` over the head dimension: the last one, or dim -2 in the kernel layout."""
    dim = -2 if flash_attn and transpose else -1
    x1, x2 = x.chunk(2, dim=dim)
    return torch.cat((-x2, x1), dim=dim)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` ``[batch, heads, seq, head_dim]`` (Hugging Face's half-split layout) by ``cos``/
    ``sin`` ``[batch, seq, dim]`` (or ``[batch, 1, seq, dim]``); ``dim < head_dim`` rotates only the
    first ``dim`` channels (partial rotary: Megatron's ``rotary_percentage``)."""
    if cos.dim() == 3:
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    dim = cos.shape[-1]
    if dim == x.shape[-1]:
        return x * cos + rotate_half(x) * sin
    rot, rest = x[..., :dim], x[..., dim:]
    return torch.cat((rot * cos + rotate_half(rot) * sin, rest), dim=-1)


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
