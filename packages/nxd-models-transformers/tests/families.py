"""Tiny random configs of transformers families nxd has no plugin for, chosen for their differences,
saved by transformers as the HF folders the tests start from (fp32, CPU, no download)."""

from __future__ import annotations

from pathlib import Path

import torch

#: shared sizes: 4 query heads over 2 KV heads (TP=2 shards whole heads), 2 layers
_BASE = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=8, max_position_embeddings=64, pad_token_id=0)

#: model_type -> what makes it different, and its config keys
FAMILIES: dict[str, dict] = {
    # sliding + global layers, q/k norms (partial gradients under TP), soft-capped logits, tied and
    # scaled embeddings (the embedding and head stay whole under TP)
    "gemma3_text": dict(sliding_window=4, layer_types=["sliding_attention", "full_attention"],
                        final_logit_softcapping=30.0, query_pre_attn_scalar=8),
    # fused qkv_proj and gate_up_proj: transformers' plan gathers them (colwise_gather_output) and
    # splits the next input (rowwise_split_input)
    "phi3": dict(num_key_value_heads=4),
    # post-norms, q/k norms over the whole projection (gathered q/k/v)
    "olmo2": dict(),
    # embedding / residual / attention multipliers and logits scaling
    "granite": dict(embedding_multiplier=2.0, residual_multiplier=0.5, attention_multiplier=0.3, logits_scaling=3.0),
    # LayerNorm with biases, GELU MLP (c_fc / c_proj) with biases, tied head
    "starcoder2": dict(use_bias=True),
    # MoE (4 experts, top-2) with attention sinks; no TP plan in transformers (TP refused, FSDP proven)
    "gpt_oss": dict(num_local_experts=4, num_experts_per_tok=2, layer_types=["sliding_attention", "full_attention"],
                    sliding_window=4),
}

#: the families transformers gives a TP plan nxd honours
TP_FAMILIES = ("gemma3_text", "phi3", "olmo2", "granite", "starcoder2")


def save_family(model_type: str, out: Path, **overrides: object) -> Path:
    """A randomly initialised ``model_type`` model saved to ``out`` (norm weights spread away from 1,
    expert weights drawn wider, so every piece counts in a gradient comparison)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from nxd_testing.reference import quiet_transformers, save_hf_oracle

    quiet_transformers()
    torch.manual_seed(0)
    config = AutoConfig.for_model(model_type, **{**_BASE, **FAMILIES[model_type], **overrides})
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return save_hf_oracle(model, out, spread_norms=True)
