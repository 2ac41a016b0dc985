"""``neuronx_distributed.overrides.transformer_overrides``: NxD's RoPE helpers."""

from nxd_modeling.rotary import apply_rotary_pos_emb, rotate_half

__all__ = ["apply_rotary_pos_emb", "rotate_half"]
