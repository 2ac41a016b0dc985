"""Op-level activation checkpointing ("op"): matmul outputs are kept, only cheap ops recompute."""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from nxd_core_parallel.activation_checkpoint import apply_activation_checkpointing


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class CountMatmuls(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default):
            self.count += 1
        return func(*args, **(kwargs or {}))


def backward_matmuls(model: nn.Module, x: torch.Tensor) -> tuple[int, list[torch.Tensor]]:
    loss = model(x).square().mean()
    with CountMatmuls() as counter:
        loss.backward()
    return counter.count, [p.grad.clone() for p in model.parameters()]


def test_op_level_keeps_matmul_outputs_and_full_recomputes_them():
    torch.manual_seed(0)
    plain = nn.Sequential(Block(16), Block(16)).double()
    x = torch.randn(4, 8, 16, dtype=torch.float64)
    op_level, full = copy.deepcopy(plain), copy.deepcopy(plain)
    assert apply_activation_checkpointing(op_level, Block, op_level=True) == 2
    assert apply_activation_checkpointing(full, Block) == 2

    plain_mm, plain_grads = backward_matmuls(plain, x)
    op_mm, op_grads = backward_matmuls(op_level, x)
    full_mm, full_grads = backward_matmuls(full, x)

    # gelu's backward needs each block's up-projection output: full checkpointing reruns that
    # matmul in backward (2 blocks: +2), op-level keeps it and reruns none
    assert op_mm == plain_mm
    assert full_mm == plain_mm + 2
    for got_op, got_full, want in zip(op_grads, full_grads, plain_grads):
        torch.testing.assert_close(got_op, want, rtol=0, atol=0)  # same ops on the same inputs
        torch.testing.assert_close(got_full, want, rtol=0, atol=0)
