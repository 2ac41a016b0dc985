"""Router statistics for pipeline parallelism: the loss they give is HF's, and packing them with a
16-bit hidden state keeps their values and gradients bit for bit."""

from __future__ import annotations

import pytest
import torch

from nxd_moe import (
    load_balancing_loss,
    losses_from_router_statistics,
    pack_router_statistics,
    router_statistics,
    router_statistics_size,
    router_z_loss,
    unpack_router_statistics,
)

E = 4


def test_statistics_summed_over_layers_give_the_losses():
    torch.manual_seed(0)
    layers = [torch.randn(12, E) for _ in range(3)]
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[0, 4:] = 0
    for m in (None, mask):
        stats = sum(router_statistics(t, E, 2, m) for t in layers)
        assert stats.shape == (router_statistics_size(E),)
        aux, z = losses_from_router_statistics(stats, len(layers), E)
        assert torch.allclose(aux, load_balancing_loss(layers, E, 2, m), rtol=1e-6, atol=0)
        assert torch.allclose(z, router_z_loss(layers), rtol=1e-6, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_pack_keeps_values_and_gradients_exact(dtype):
    torch.manual_seed(1)
    n = router_statistics_size(E)
    hidden = torch.randn(2, 3, 8).to(dtype).requires_grad_()
    stats = (torch.randn(n) * 1e3 + 1 / 3).requires_grad_()  # values 16-bit types cannot hold
    packed = pack_router_statistics(hidden, stats)
    assert packed.dtype == dtype and packed.dim() == 1
    received = packed.detach().clone().requires_grad_()  # what the next stage receives
    h, s = unpack_router_statistics(received, n, 2, 8)
    assert torch.equal(h, hidden.detach()) and torch.equal(s, stats.detach())
    w_h, w_s = torch.randn_like(h), torch.randn(n) / 3
    ((h * w_h).sum() + (s * w_s).sum()).backward()
    packed.backward(received.grad)  # the gradient travels back to the sending stage
    assert torch.equal(hidden.grad, w_h) and torch.equal(stats.grad, w_s)
