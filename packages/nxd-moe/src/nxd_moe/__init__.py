"""Mixture-of-Experts layers for nxd: routers, auxiliary losses, capacity-factor and dropless
routing, SwiGLU experts built whole and split over TP and EP by the expert-parallel plan (the
``expert_parallel`` model transform), and expert parallelism (all-to-all token dispatch)."""

from nxd_moe.balancer import (
    attach_expert_bias_update,
    biased_routers,
    expert_bias_update,
    innermost_optimizer,
    routers_of_optimizer,
    update_expert_biases,
)
from nxd_moe.capacity import expert_capacity, kept_assignments, max_routed_rows
from nxd_moe.config import ROUTING_ALGORITHMS, MoEConfig
from nxd_moe.dispatch import DispatchPlan, all_to_all, combine, dispatch
from nxd_moe.expert_plan import apply_expert_plan, split_experts
from nxd_moe.experts import ExpertMLPs, ExpertShard, gather_experts, grouped_mm_runs, local_experts
from nxd_moe.groups import ExpertParallelGroups, expert_parallel_groups
from nxd_moe.layer import MoELayer
from nxd_moe.losses import (
    load_balancing_loss,
    losses_from_router_statistics,
    router_statistics,
    router_statistics_size,
    router_z_loss,
    sequence_balance_loss,
)
from nxd_moe.pipeline import pack_router_statistics, unpack_router_statistics
from nxd_moe.routing import RouterSinkhorn, RouterTopK, group_limited_scores, make_router, sinkhorn

__version__ = "0.1.0"

__all__ = [
    "ROUTING_ALGORITHMS", "DispatchPlan", "attach_expert_bias_update", "biased_routers", "expert_bias_update",
    "group_limited_scores", "grouped_mm_runs", "innermost_optimizer", "routers_of_optimizer", "sequence_balance_loss",
    "update_expert_biases", "ExpertMLPs", "ExpertParallelGroups", "ExpertShard", "apply_expert_plan", "split_experts", "MoEConfig", "MoELayer",
    "RouterSinkhorn", "RouterTopK", "all_to_all", "combine", "dispatch", "expert_capacity", "max_routed_rows",
    "expert_parallel_groups", "gather_experts", "kept_assignments", "local_experts", "load_balancing_loss",
    "losses_from_router_statistics",
    "make_router", "pack_router_statistics", "router_statistics", "router_statistics_size", "router_z_loss",
    "sinkhorn", "unpack_router_statistics",
]
