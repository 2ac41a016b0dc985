"""AdamW_FP32OptimParams against Hugging Face AdamW's update written out in float64, and its fp32
states for bf16 parameters."""

from __future__ import annotations

import math

import torch

from nxd_zero1.optim import AdamW_FP32OptimParams


def hf_adamw_reference(p: torch.Tensor, grads: list[torch.Tensor], lr: float, betas: tuple[float, float], eps: float,
                       wd: float) -> torch.Tensor:
    p, m, v = p.double().clone(), torch.zeros_like(p, dtype=torch.float64), torch.zeros_like(p, dtype=torch.float64)
    for step, g in enumerate(grads, start=1):
        g = g.double()
        m = betas[0] * m + (1 - betas[0]) * g
        v = betas[1] * v + (1 - betas[1]) * g * g
        step_size = lr * math.sqrt(1 - betas[1] ** step) / (1 - betas[0] ** step)
        p = p - step_size * m / (v.sqrt() + eps)
        p = p - lr * wd * p  # decoupled decay after the Adam step (HF's order)
    return p


def test_matches_hf_adamw_update():
    g = torch.Generator().manual_seed(0)
    start = torch.randn(5, 3, generator=g)
    grads = [torch.randn(5, 3, generator=g) for _ in range(3)]
    param = torch.nn.Parameter(start.clone())
    opt = AdamW_FP32OptimParams([param], lr=0.01, betas=(0.9, 0.99), eps=1e-6, weight_decay=0.1)
    for grad in grads:
        param.grad = grad.clone()
        opt.step()
    expected = hf_adamw_reference(start, grads, 0.01, (0.9, 0.99), 1e-6, 0.1)
    assert float((param.double() - expected).abs().max() / expected.abs().max()) < 1e-6


def test_bf16_parameters_keep_fp32_states():
    param = torch.nn.Parameter(torch.ones(4, dtype=torch.bfloat16))
    opt = AdamW_FP32OptimParams([param], lr=0.1)
    param.grad = torch.full((4,), 0.5, dtype=torch.bfloat16)
    opt.step()
    state = opt.state[param]
    assert state["exp_avg"].dtype == state["exp_avg_sq"].dtype == torch.float32
    assert param.dtype == torch.bfloat16 and float(param[0]) < 1.0
