"""Mixtral's parallel plan, as data (the model class carries it, the spec registers it; applied by
:func:`nxd_tensor_parallel.tensor_plan.parallelize`, the ``parallel_plan`` transform's function).
The experts are nxd-moe's ``ExpertMLPs``: split over EP, each expert's MLP over TP."""

from __future__ import annotations

from nxd.specs import ParallelPlan

MIXTRAL_PLAN = ParallelPlan(
    column=("model.layers.*.self_attn.qkv_proj", "lm_head"),
    row=("model.layers.*.self_attn.o_proj",),
    vocab=("model.embed_tokens",),
    sequence=("model.layers.*.input_layernorm", "model.layers.*.post_attention_layernorm", "model.norm"),
    experts=("model.layers.*.block_sparse_moe.experts",),
    pipeline_blocks=("model.layers.*",),
    # any vocabulary at any TP (Megatron's multiple when the config sets make_vocab_size_divisible_by):
    # padded rows never show; query heads TP does not divide get zero heads (NxD's pad_model)
    padded=("model.embed_tokens", "lm_head", "model.layers.*.self_attn.qkv_proj", "model.layers.*.self_attn.o_proj"),
    sequence_dimension=1,
)
