"""Qwen3-MoE's parallel plan, as data: Mixtral's with Qwen3-MoE's names (the feed-forward is
``mlp``: experts, or Llama's dense MLP in the layers left dense). Qwen3 dense is Llama's model and plan."""

from __future__ import annotations

import dataclasses

from nxd_models_mixtral.plan import MIXTRAL_PLAN

QWEN3_MOE_PLAN = dataclasses.replace(
    MIXTRAL_PLAN,
    column=(*MIXTRAL_PLAN.column, "model.layers.*.mlp.gate_up_proj"),
    row=(*MIXTRAL_PLAN.row, "model.layers.*.mlp.down_proj"),
    experts=("model.layers.*.mlp.experts",),
    context_parallel=("model.layers.*.self_attn.core_attention",),
)
