"""MoELayer at EP=2 on two gloo ranks against one process with all experts: outputs, input grads and
every expert's gradient (summed over both ranks' tokens by the all-to-all backward), for dropless
routing and for capacity-factor dropping (capacity counted over each rank's own tokens)."""

from __future__ import annotations

import pytest
import torch

H, INTER, E = 32, 48, 4


def _weights() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"router": torch.randn(E, H, generator=g) * 0.5, "gate_up": torch.randn(E, 2 * INTER, H, generator=g) * 0.2,
            "down": torch.randn(E, H, INTER, generator=g) * 0.2}


def _inputs(rank: int) -> torch.Tensor:
    return torch.randn(2, 8, H, generator=torch.Generator().manual_seed(10 + rank))


def _run(moe: dict, weights: dict[str, torch.Tensor], x: torch.Tensor, first: int, count: int) -> dict:
    import nxd
    from nxd_moe import MoEConfig, MoELayer, split_experts

    layer = MoELayer(MoEConfig(num_experts=E, top_k=2, **moe), H, INTER)
    assert layer.experts.num_local_experts == E  # built plain: the expert-parallel plan splits it
    layer.experts = split_experts(layer.experts, nxd.parallel.resolve_context())
    assert layer.experts.num_local_experts == count
    with torch.no_grad():
        layer.router.weight.copy_(weights["router"])
        layer.experts.gate_up_proj.copy_(weights["gate_up"][first:first + count])
        layer.experts.down_proj.copy_(weights["down"][first:first + count])
    x = x.clone().requires_grad_()
    out, _ = layer(x)
    (out * torch.linspace(-1, 1, H)).sum().backward()
    return {"out": out.detach(), "x_grad": x.grad, "router": layer.router.weight.grad,
            "gate_up": layer.experts.gate_up_proj.grad, "down": layer.experts.down_proj.grad}


def ep_layer_body(moe: dict) -> dict:
    import torch.distributed as dist

    from nxd_core_parallel import parallel_state

    parallel_state.initialize_model_parallel(1, expert_model_parallel_size=2)
    rank = dist.get_rank()
    return _run(moe, _weights(), _inputs(rank), first=rank * E // 2, count=E // 2)


@pytest.mark.parametrize("moe", [dict(dropless=True), dict(capacity_factor=0.75),
                                 dict(dropless=True, router_activation="sigmoid", n_group=2, topk_group=1,
                                      routed_scaling_factor=2.5, expert_bias=True)],
                         ids=["dropless", "capacity", "deepseek_group_limited"])
def test_ep2_layer_matches_all_experts_in_one_process(rank_pool, moe):
    got = rank_pool(2).run(ep_layer_body, moe, timeout=600)
    refs = [_run(moe, _weights(), _inputs(r), first=0, count=E) for r in range(2)]
    for r in range(2):
        for key in ("out", "x_grad", "router"):
            torch.testing.assert_close(got[r][key], refs[r][key], rtol=1e-5, atol=1e-6)
        # the rank's experts receive the gradient from both ranks' tokens
        for key in ("gate_up", "down"):
            full = refs[0][key] + refs[1][key]
            torch.testing.assert_close(got[r][key], full[r * E // 2:(r + 1) * E // 2], rtol=1e-5, atol=1e-6)
