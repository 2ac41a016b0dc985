"""DeepSeek-V3's parallel plan, as data (the model class carries it, the spec registers it; applied
by :func:`nxd_tensor_parallel.tensor_plan.parallelize`, the ``parallel_plan`` transform's function)."""

from __future__ import annotations

import dataclasses

from nxd.specs import ParallelPlan

#: heads over TP (``q_b_proj``, or ``q_proj`` without ``q_lora_rank``, and ``kv_b_proj`` column,
#: ``o_proj`` row); the down projections and their norms are replicated (not named); routed experts
#: split over EP, shared ones (also ``ExpertMLPs``, ``ep_size`` 1) never; under context parallelism
#: the attention's keys ([k_nope | k_rope]) and values travel around the CP ring
_PLAN = dict(
    column=("model.layers.*.self_attn.q_[bp]*", "model.layers.*.self_attn.kv_b_proj", "model.layers.*.mlp.gate_up_proj"),
    row=("model.layers.*.self_attn.o_proj", "model.layers.*.mlp.down_proj"),
    sequence=("model.layers.*.input_layernorm", "model.layers.*.post_attention_layernorm"),
    # after the replicated down projections (whole sequence): no sequence gather inside
    whole_sequence=("model.layers.*.self_attn.q_[bp]*", "model.layers.*.self_attn.kv_b_proj"),
    experts=("model.layers.*.mlp.experts", "model.layers.*.mlp.shared_experts"),
)
#: the MTP modules (``mtp.{k}``, built with ``mtp_depth``) are decoder blocks too (MoE ones: they
#: come after the last layer, past ``first_k_dense_replace``), plus their norms
_MTP_PLAN = {style: tuple(p.replace("model.layers.*", "mtp.*") for p in patterns
                          if not p.endswith((".mlp.gate_up_proj", ".mlp.down_proj")))
             for style, patterns in _PLAN.items()}
_MTP_PLAN["sequence"] += ("mtp.*.enorm", "mtp.*.hnorm", "mtp.*.shared_head.norm")
DEEPSEEK_PLAN = ParallelPlan(
    column=(*_PLAN["column"], "lm_head"),
    row=_PLAN["row"],
    vocab=("model.embed_tokens",),
    sequence=(*_PLAN["sequence"], "model.norm"),
    experts=_PLAN["experts"],
    pipeline_blocks=("model.layers.*",),
    context_parallel=("model.layers.*.self_attn.core_attention",),
    whole_sequence=_PLAN["whole_sequence"],
    sequence_dimension=1,
)
#: the plan of a model built with ``mtp_depth`` > 0
DEEPSEEK_MTP_PLAN = dataclasses.replace(
    DEEPSEEK_PLAN, **{style: (*getattr(DEEPSEEK_PLAN, style), *_MTP_PLAN[style]) for style in _MTP_PLAN})
