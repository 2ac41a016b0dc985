"""Expert parallelism applied to a plain model in one place: the ``expert_parallel`` transform.

A model family builds its experts plain (:class:`nxd_moe.ExpertMLPs` holding every expert, whole)
and names them in its :class:`nxd.specs.ParallelPlan`'s ``experts`` patterns. The transform (slot
``expert_parallel``, right after the tensor-parallel plan) replaces each named module with the one
of this rank's :class:`nxd_moe.experts.ExpertShard`: its experts over ``ep`` (routed experts only)
and its slice of each expert's intermediate dimension over ``tp``, holding those pieces of the
weights the plain module had. A model built on the meta device stays there (each module's
``reset_parameters`` later draws the whole experts and keeps its part, so the weights are the
plain build's). After every optimizer step it moves the expert biases of aux-loss-free routers
(``after_optimizer_step``: :func:`nxd_moe.balancer.expert_bias_balancer`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from nxd.errors import ConfigError
from nxd.parallel import ParallelContext, dim_rank, dim_size
from nxd.transforms import ALWAYS, ModelTransform
from nxd_moe.balancer import expert_bias_balancer
from nxd_moe.experts import ExpertMLPs, ExpertShard
from nxd_moe.groups import expert_parallel_groups

NAME = "expert_parallel"


def expert_shard(experts: ExpertMLPs, context: ParallelContext | None) -> ExpertShard:
    """The part of ``experts`` this rank of ``context`` holds (shared experts: TP only)."""
    tp = dict(tp_size=dim_size(context, "tp"), tp_rank=dim_rank(context, "tp"))
    if not experts.expert_parallel:
        return ExpertShard(**tp)
    groups = expert_parallel_groups(context)
    return ExpertShard(groups.ep_size, groups.ep_rank, groups.ep_group, groups.edp_group, **tp)


def split_experts(experts: ExpertMLPs, context: ParallelContext | None) -> ExpertMLPs:
    """``experts`` (built plain) as this rank's module over ``context``: its shard's experts and TP
    slice of the same weights (on the meta device: shapes only). Already split: returned as is."""
    if experts.shard != ExpertShard():
        return experts
    source = experts.gate_up_proj
    split = ExpertMLPs(experts.num_experts, experts.hidden_size, experts.intermediate_size, dtype=source.dtype,
                       device="meta", init_std=experts.init_std, output_init_std=experts.output_init_std,
                       grouped_gemm=experts.grouped_gemm, expert_parallel=experts.expert_parallel,
                       shard=expert_shard(experts, context))  # on meta: nothing drawn
    split.train(experts.training)
    if source.is_meta:
        return split
    split.allocate(source.dtype, source.device)
    with torch.no_grad():
        for name in ("gate_up_proj", "down_proj"):
            getattr(split, name).copy_(split.local_part(name, getattr(experts, name).detach()))
            getattr(split, name).requires_grad_(getattr(experts, name).requires_grad)
    return split


def apply_expert_plan(model: nn.Module, context: ParallelContext | None, config: Any) -> nn.Module | None:
    """The ``expert_parallel`` transform: every module the model's plan names ``experts`` split by
    :func:`split_experts` (nothing for a model without a plan or experts)."""
    from nxd_tensor_parallel.tensor_plan import plan_of

    plan = plan_of(model)
    if plan is None or not plan.experts:
        return None
    for name, module in plan.modules(model, "experts"):
        if not isinstance(module, ExpertMLPs):
            raise ConfigError(f"parallel plan: {name} is named experts but is a {type(module).__name__}; the expert-"
                              "parallel plan splits nxd_moe.ExpertMLPs")
        parent_name, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(parent_name), leaf, split_experts(module, context))
    return model


EXPERT_PARALLEL_TRANSFORM = ModelTransform(
    # at any size: the split also gives the experts their EP groups at EP=1 (ZeRO-1's param groups)
    NAME, "expert_parallel", apply_expert_plan, ALWAYS, after_optimizer_step=expert_bias_balancer,
    description="the plan's experts (nxd_moe.ExpertMLPs, built whole) split over EP and each expert's MLP over TP; "
                "aux-loss-free expert biases moved after each optimizer step")
