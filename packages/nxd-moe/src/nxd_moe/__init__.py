"""Mixture-of-Experts layers for nxd: routers, auxiliary losses, capacity-factor and dropless
routing, SwiGLU experts sharded over TP, and expert parallelism (all-to-all token dispatch)."""

from nxd_moe.capacity import expert_capacity, kept_assignments
from nxd_moe.config import ROUTING_ALGORITHMS, MoEConfig
from nxd_moe.dispatch import DispatchPlan, all_to_all, combine, dispatch
from nxd_moe.experts import ExpertMLPs
from nxd_moe.groups import ExpertParallelGroups, expert_parallel_groups
from nxd_moe.layer import MoELayer
from nxd_moe.losses import (
    load_balancing_loss,
    losses_from_router_statistics,
    router_statistics,
    router_statistics_size,
    router_z_loss,
)
from nxd_moe.pipeline import pack_router_statistics, unpack_router_statistics
from nxd_moe.routing import RouterSinkhorn, RouterTopK, make_router, sinkhorn

__version__ = "0.1.0"

__all__ = [
    "ROUTING_ALGORITHMS", "DispatchPlan", "ExpertMLPs", "ExpertParallelGroups", "MoEConfig", "MoELayer",
    "RouterSinkhorn", "RouterTopK", "all_to_all", "combine", "dispatch", "expert_capacity",
    "expert_parallel_groups", "kept_assignments", "load_balancing_loss", "losses_from_router_statistics",
    "make_router", "pack_router_statistics", "router_statistics", "router_statistics_size", "router_z_loss",
    "sinkhorn", "unpack_router_statistics",
]
