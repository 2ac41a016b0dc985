"""DeepSeek-V3's parallel plan, as data (the model class carries it, the spec registers it).

Heads over TP (``q_b_proj``, or ``q_proj`` without ``q_lora_rank``, and ``kv_b_proj`` column,
``o_proj`` row); the down projections and their norms are replicated (not named) and see the whole
sequence, so the column layers after them take whole-sequence inputs under sequence parallelism;
routed experts split over EP, shared ones (also ``ExpertMLPs``, ``ep_size`` 1) never; under context
parallelism the attention's keys ([k_nope | k_rope]) and values travel around the CP ring."""

from __future__ import annotations

from nxd.specs import ParallelPlan

DEEPSEEK_PLAN = ParallelPlan(
    column=("model.layers.*.self_attn.q_[bp]*", "model.layers.*.self_attn.kv_b_proj", "model.layers.*.mlp.gate_up_proj",
            "lm_head"),
    row=("model.layers.*.self_attn.o_proj", "model.layers.*.mlp.down_proj"),
    vocab=("model.embed_tokens",),
    sequence=("model.layers.*.input_layernorm", "model.layers.*.post_attention_layernorm", "model.norm"),
    experts=("model.layers.*.mlp.experts", "model.layers.*.mlp.shared_experts"),
    pipeline_blocks=("model.layers.*",),
    context_parallel=("model.layers.*.self_attn",),
    whole_sequence=("model.layers.*.self_attn.q_[bp]*", "model.layers.*.self_attn.kv_b_proj"),
    sequence_dimension=1,
)
