"""Aux-loss-free load balancing (DeepSeek-V3, section 2.1.2): after every training step each
expert's bias moves by ``gamma`` against its load, ``b_i <- b_i + gamma * sign(mean load - load_i)``
(overloaded experts become less likely to be chosen, underloaded ones more). The bias only shifts
the choice of experts; the affinities that weight their outputs are unbiased.

Routers with ``expert_bias`` count their assignments in training (``expert_load``); the update sums
those counts over the data-parallel ranks (every rank then applies the same update, so the biases
stay identical) and clears them. :func:`expert_bias_balancer` is the ``expert_parallel`` transform's
``after_optimizer_step``: ``initialize_parallel_optimizer`` (and so ``nxd train``) runs it after each
step; :func:`attach_expert_bias_update` does the same for an optimizer built by hand.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from nxd.trainer import innermost_optimizer
from nxd_moe.routing import RouterTopK


def expert_bias_update(bias: torch.Tensor, load: torch.Tensor, rate: float) -> torch.Tensor:
    """The paper's rule: ``bias + rate * sign(mean(load) - load)``."""
    return bias + rate * torch.sign(load.mean() - load)


def biased_routers(module: nn.Module) -> list[RouterTopK]:
    """The routers of ``module`` that balance with a bias."""
    return [m for m in module.modules() if isinstance(m, RouterTopK) and m.e_score_correction_bias is not None]


@torch.no_grad()
def update_expert_biases(routers: list[RouterTopK], group: Any = None) -> None:
    """Apply :func:`expert_bias_update` (each router's ``bias_update_rate``) to every router from its
    load summed over ``group`` (one all-reduce for all), then clear the loads. Collective over ``group``."""
    if not routers:
        return
    loads = torch.stack([r.expert_load for r in routers])
    if group is not None and dist.is_initialized() and dist.get_world_size(group) > 1:
        dist.all_reduce(loads, group=group)
    for router, load in zip(routers, loads):
        if load.sum() > 0:  # no training forward since the last step (e.g. a skipped step): no update
            new = expert_bias_update(router.e_score_correction_bias, load, router.bias_update_rate)
            router.e_score_correction_bias.copy_(new)
        router.expert_load.zero_()


def attach_expert_bias_update(optimizer: torch.optim.Optimizer, routers: list[RouterTopK], group: Any = None) -> Any:
    """Run :func:`update_expert_biases` after every step of ``optimizer`` (the innermost torch
    optimizer of a wrapper: its step runs once per training step). Returns the hook handle."""
    return innermost_optimizer(optimizer).register_step_post_hook(lambda *_: update_expert_biases(routers, group))


def routers_of_optimizer(optimizer: torch.optim.Optimizer) -> list[RouterTopK]:
    """The bias-balanced routers whose weight ``optimizer`` trains (each router's weight carries a
    reference to it, so a plugin seeing only the optimizer finds them)."""
    seen: dict[int, RouterTopK] = {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            ref = getattr(p, "nxd_moe_router", None)
            router = ref() if ref is not None else None
            if router is not None and router.e_score_correction_bias is not None:
                seen[id(router)] = router
    return list(seen.values())


def expert_bias_balancer(optimizer: torch.optim.Optimizer, context: Any, config: Any) -> Any:
    """The ``expert_parallel`` transform's ``after_optimizer_step``: for the bias-balanced routers
    ``optimizer`` trains, :func:`update_expert_biases` over the data x context parallel ranks
    (``None``: no such router, nothing to run)."""
    routers = routers_of_optimizer(optimizer)
    if not routers:
        return None
    group = None if context is None else (context.dp_cp.group if context.cp.size > 1 else context.dp.group)
    return lambda: update_expert_biases(routers, group)
