"""GPT's parallel plan, as data (the model class carries it, the spec registers it; applied by
:func:`nxd_tensor_parallel.tensor_plan.parallelize`, the ``parallel_plan`` transform's function).
``linear_qkv`` holds Megatron's per-group interleave, so a plain row shard is whole query groups;
the word embeddings keep whole sequences (``GPTEmbedding`` scatters after adding positions).
Query heads TP does not divide are padded with zero query groups (NxD's ``pad_model``)."""

from __future__ import annotations

from nxd.specs import ParallelPlan

GPT_PLAN = ParallelPlan(
    column=("decoder.layers.*.self_attention.linear_qkv", "decoder.layers.*.mlp.linear_fc1", "output_layer"),
    row=("decoder.layers.*.self_attention.linear_proj", "decoder.layers.*.mlp.linear_fc2"),
    vocab=("embedding.word_embeddings",),
    sequence=("decoder.layers.*layernorm", "decoder.final_layernorm"),
    pipeline_blocks=("decoder.layers.*",),
    whole_sequence=("embedding.word_embeddings",),
    # Megatron's vocabulary padding (a multiple of make_vocab_size_divisible_by x TP, which the layers
    # declare); NxD's pad_model: query groups TP does not divide (and query heads it does not divide
    # either, else K/V heads are replicated) are padded with zero groups (pad_heads)
    padded=("embedding.word_embeddings", "output_layer", "decoder.layers.*.self_attention.linear_qkv",
            "decoder.layers.*.self_attention.linear_proj"),
    sequence_dimension=1,
)
