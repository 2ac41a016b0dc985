"""``AdamW_FP32OptimParams``: NxD's AdamW (Hugging Face's formulation) with fp32 optimizer states, so
bf16 parameters keep full-precision moments."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.optim import Optimizer


def run_closure(closure: Callable[[], Any] | None) -> Any:
    """torch.optim's step convention: the loss the closure re-evaluates (with gradients on), or None."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


class AdamW_FP32OptimParams(Optimizer):  # noqa: N801 - NxD's name
    """Decoupled-weight-decay Adam. ``exp_avg``/``exp_avg_sq`` are fp32 (fp64 for fp64 parameters)
    whatever the parameter dtype; the update is computed in that precision and written back in the
    parameter's dtype. Weight decay is applied after the Adam step, as Hugging Face's AdamW does."""

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-6, weight_decay: float = 0.0, correct_bias: bool = True,
                 no_deprecation_warning: bool = True, differentiable: bool = False, capturable: bool = False) -> None:
        if lr < 0.0:
            raise ValueError(f"Invalid learning rate: {lr} - should be >= 0.0")
        for i, beta in enumerate(betas):
            if not 0.0 <= beta < 1.0:
                raise ValueError(f"Invalid beta parameter at index {i}: {beta} - should be in [0.0, 1.0)")
        if eps < 0.0:
            raise ValueError(f"Invalid epsilon value: {eps} - should be >= 0.0")
        defaults = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay, "correct_bias": correct_bias,
                    "capturable": capturable}
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = run_closure(closure)
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("AdamW_FP32OptimParams does not support sparse gradients")
                work = torch.float64 if p.dtype == torch.float64 else torch.float32
                grad = p.grad.to(work)
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(grad)
                    state["exp_avg_sq"] = torch.zeros_like(grad)
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                state["step"] += 1
                exp_avg.mul_(beta1).add_(grad, alpha=1.0 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1.0 - beta2)
                denom = exp_avg_sq.sqrt().add_(group["eps"])
                step_size = group["lr"]
                if group["correct_bias"]:
                    step_size *= math.sqrt(1.0 - beta2 ** state["step"]) / (1.0 - beta1 ** state["step"])
                value = p.to(work)
                value.addcdiv_(exp_avg, denom, value=-step_size)
                if group["weight_decay"] > 0.0:
                    value.add_(value, alpha=-group["lr"] * group["weight_decay"])
                p.copy_(value)
        return loss
