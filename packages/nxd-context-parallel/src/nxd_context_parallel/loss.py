"""The loss under context parallelism: the mean over every supervised token of every CP rank."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


class _SumOverContextParallel(torch.autograd.Function):
    """Forward: all-reduce (sum) over the CP group. Backward: the gradient times the CP size.

    Every CP rank then holds the whole loss, and its parameter gradients are ``cp`` times its
    share: averaging gradients over DP x CP (Megatron) or over CP (NxD's
    ``allreduce_context_parallel_gradients``) gives the exact gradient of the global mean."""

    @staticmethod
    def forward(ctx: Any, partial: torch.Tensor, group: Any) -> torch.Tensor:
        total = partial.clone()
        dist.all_reduce(total, group=group)
        ctx.size = dist.get_world_size(group)
        return total

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad * ctx.size, None


def context_parallel_token_mean(loss_sum: torch.Tensor, token_count: torch.Tensor, group: Any) -> torch.Tensor:
    """``sum of every CP rank's loss_sum / sum of every CP rank's token_count`` (0 when no token is
    supervised anywhere), the same value on every CP rank; differentiable in ``loss_sum``."""
    count = token_count.detach().to(loss_sum.dtype).clone()
    dist.all_reduce(count, group=group)
    return _SumOverContextParallel.apply(loss_sum / count.clamp(min=1.0), group)
