"""NxD's ``TorchBlockwiseTraining`` (its torch blockwise expert matmul with a hand-written backward)
against torch autograd of the same SiLU-GLU experts computed token by token: output and the
gradients of hidden states, masked affinities and both weights; blocks padded with -1 slots."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("nxd_moe")

T, H, INTER, E, K, B = 7, 4, 3, 3, 2, 4


def _layout(chosen: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each expert's tokens in blocks of B slots, the last block padded with -1 (NxD's layout)."""
    positions, experts = [], []
    for e in range(E):
        tokens = [t for t in range(T) if e in chosen[t]]
        for start in range(0, len(tokens), B):
            block = tokens[start:start + B]
            positions += block + [-1] * (B - len(block))
            experts.append(e)
    return torch.tensor(positions), torch.tensor(experts)


def test_torch_blockwise_training_matches_autograd_of_the_experts():
    from neuronx_distributed.modules.moe.blockwise import (
        TorchBlockwiseTraining,
        augment_inputs_for_padded_blockwise_matmul,
    )

    g = torch.Generator().manual_seed(0)
    x, gu, down = torch.randn(T, H, generator=g), torch.randn(E, H, 2 * INTER, generator=g), torch.randn(
        E, INTER, H, generator=g)
    scores = torch.randn(T, E, generator=g).softmax(-1)
    chosen = scores.topk(K).indices
    affinities = torch.zeros(T, E).scatter(1, chosen, scores.gather(1, chosen))
    positions, block_to_expert = _layout(chosen)
    assert (positions == -1).any()  # the padding path is exercised
    weights = torch.linspace(-1, 1, T * H).view(T, H)

    leaves = [t.clone().requires_grad_(True) for t in (x, affinities, gu, down)]
    out = TorchBlockwiseTraining.apply(leaves[0], leaves[1], positions, block_to_expert, leaves[2], leaves[3])
    (out * weights).sum().backward()

    ref = [t.clone().requires_grad_(True) for t in (x, affinities, gu, down)]
    rx, ra, rgu, rdown = ref
    rows = []
    for t in range(T):
        row = torch.zeros(H)
        for e in chosen[t].tolist():
            gate, up = (rx[t] @ rgu[e]).chunk(2)
            row = row + ra[t, e] * ((F.silu(gate) * up) @ rdown[e])
        rows.append(row)
    (torch.stack(rows) * weights).sum().backward()
    # fp32, sums of <= 2*INTER*H terms accumulated in another order: a few ulp of O(10) values
    torch.testing.assert_close(out.detach(), torch.stack(rows).detach(), rtol=1e-5, atol=1e-5)
    for got, want in zip(leaves, ref, strict=True):
        torch.testing.assert_close(got.grad, want.grad, rtol=1e-5, atol=1e-5)

    padded = augment_inputs_for_padded_blockwise_matmul(torch.zeros(T, H), x, positions, affinities)
    assert [tuple(p.shape) for p in padded] == [(T + 1, H), (T + 1, H), tuple(positions.shape), (T + 1, E)]
    assert (padded[2][positions == -1] == T).all() and padded[1][T].abs().sum() == 0
