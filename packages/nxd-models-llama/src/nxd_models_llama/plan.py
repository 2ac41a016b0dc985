"""Llama's parallel plan, as data: which modules of the one-device model are column, row or
vocabulary parallel, which run on sequence shards, where a pipeline may cut. The model class
carries it (``LlamaForCausalLM.nxd_parallel_plan``) and the spec registers it; nxd-tensor-parallel's
``parallel_plan`` transform (:func:`nxd_tensor_parallel.tensor_plan.parallelize`) applies it."""

from __future__ import annotations

from nxd.specs import ParallelPlan

LLAMA_PLAN = ParallelPlan(
    column=("model.layers.*.self_attn.qkv_proj", "model.layers.*.mlp.gate_up_proj", "lm_head"),
    row=("model.layers.*.self_attn.o_proj", "model.layers.*.mlp.down_proj"),
    vocab=("model.embed_tokens",),
    sequence=("model.layers.*.input_layernorm", "model.layers.*.post_attention_layernorm", "model.norm"),
    pipeline_blocks=("model.layers.*",),
    context_parallel=("model.layers.*.self_attn.core_attention",),
    # any vocabulary at any TP: padded rows never show (logits -inf, exports cut them); query heads
    # TP does not divide get zero heads (NxD's pad_model; the attention zeroes their output)
    padded=("model.embed_tokens", "lm_head", "model.layers.*.self_attn.qkv_proj", "model.layers.*.self_attn.o_proj"),
    sequence_dimension=1,
)
