"""NxD's ``moe_parallel_layers`` (ExpertFusedColumnParallelLinear -> ExpertFusedRowParallelLinear, NxD's
constructor arguments) at TP=2 on 2 gloo ranks against one process computing NxD's math in plain
torch on the full weights: ``relu(x @ W1[e] + b1[e]) @ W2[e]`` per expert, output and gradients (input
and this rank's weight slices), with and without ``expert_indices``; and NxD's ``Experts`` on them
(fused gate/up, GLU and SwiGLU with NxD's scaling, bias and clamps)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("nxd_moe")

E, H, INTER, C = 3, 4, 6, 5


def _weights() -> dict:
    g = torch.Generator().manual_seed(0)
    return {"w1": torch.randn(E, H, INTER, generator=g), "b1": torch.randn(E, INTER, generator=g),
            "w2": torch.randn(E, INTER, H, generator=g), "x": torch.randn(E, 1, C, H, generator=g)}  # NxD's (e, 1, c, h)


def _reference(t: dict, experts: list[int]) -> dict:
    w1, b1, w2 = (t[k].clone().requires_grad_(True) for k in ("w1", "b1", "w2"))
    x = t["x"].clone().requires_grad_(True)
    out = torch.einsum("e...h,ehi->e...i", x, w1[experts]) + b1[experts][:, None, None]
    out = torch.einsum("e...i,eih->e...h", out.relu(), w2[experts])
    (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
    return {"out": out.detach(), "x": x.grad, "w1": w1.grad, "w2": w2.grad, "b1": b1.grad}


def layers_body(t: dict) -> dict:
    from neuronx_distributed.modules.moe.moe_parallel_layers import (
        ExpertFusedColumnParallelLinear,
        ExpertFusedRowParallelLinear,
    )
    from nxd_core_parallel import parallel_state

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=2)
    rank, i = parallel_state.get_tensor_model_parallel_rank(), INTER // 2
    col = ExpertFusedColumnParallelLinear(num_experts=E, input_size=H, output_size=INTER, bias=True)
    row = ExpertFusedRowParallelLinear(num_experts=E, input_size=INTER, output_size=H, reduce_output=True)
    assert col.weight.shape == (E, H, i) and row.weight.shape == (E, i, H) and col.weight.partition_dim == 2
    with torch.no_grad():  # NxD's layouts: this rank's columns of W1 / b1, rows of W2
        col.weight.copy_(t["w1"][:, :, rank * i:(rank + 1) * i])
        col.bias.copy_(t["b1"][:, rank * i:(rank + 1) * i])
        row.weight.copy_(t["w2"][:, rank * i:(rank + 1) * i])
    got = {}
    for name, indices in (("all", None), ("picked", torch.tensor([2, 0, 1]))):
        for p in (*col.parameters(), *row.parameters()):
            p.grad = None
        x = t["x"].clone().requires_grad_(True)
        out = row(col(x, indices).relu(), indices)
        (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
        got[name] = {"out": out.detach(), "x": x.grad, "w1": col.weight.grad, "w2": row.weight.grad,
                     "b1": col.bias.grad}
    return got


def test_expert_fused_layers_match_one_process(rank_pool):
    t = _weights()
    want = {"all": _reference(t, [0, 1, 2]), "picked": _reference(t, [2, 0, 1])}
    i = INTER // 2
    for rank, got in enumerate(rank_pool(2).run(layers_body, t)):
        for name, ref in want.items():
            cols = slice(rank * i, (rank + 1) * i)
            # fp32 matmuls of <= 6 terms, summed over 2 ranks in another order: a few ulp
            close = dict(rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(got[name]["out"], ref["out"], **close)
            torch.testing.assert_close(got[name]["x"], ref["x"], **close)
            torch.testing.assert_close(got[name]["w1"], ref["w1"][:, :, cols], **close)
            torch.testing.assert_close(got[name]["b1"], ref["b1"][:, cols], **close)
            torch.testing.assert_close(got[name]["w2"], ref["w2"][:, cols], **close)


def test_keep_master_weight_is_refused_by_name():
    from neuronx_distributed.modules.moe.moe_parallel_layers import ExpertFusedColumnParallelLinear

    with pytest.raises(NotImplementedError, match="keep_master_weight"):
        ExpertFusedColumnParallelLinear(2, 4, 4, keep_master_weight=True, tensor_model_parallel_group=object(),
                                        expert_model_parallel_group=object())


#: (glu_type, hidden_act_scaling_factor, hidden_act_bias, gate clamp max, up clamp (min, max))
GLU_CASES = (("glu", 1.0, 0.0, None, (None, None)), ("swiglu", 1.702, 1.0, 0.7, (-0.7, 0.7)))


def _glu_reference(t: dict, glu_type: str, scale: float, act_bias: float, gate_max, up_clamp) -> dict:
    gu, w2 = t["gu"].clone().requires_grad_(True), t["w2"].clone().requires_grad_(True)
    x = t["x"][:, 0].clone().requires_grad_(True)
    gate, up = torch.einsum("ech,ehi->eci", x, gu).chunk(2, dim=-1)
    gate = gate if gate_max is None else gate.clamp(max=gate_max)
    up = up if up_clamp[0] is None else up.clamp(*up_clamp)
    act = torch.nn.functional.silu(scale * gate)
    hidden = (act if glu_type == "glu" else gate * act) * (up + act_bias)
    out = torch.einsum("eci,eih->ech", hidden, w2)
    (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
    return {"out": out.detach(), "x": x.grad, "gu": gu.grad, "w2": w2.grad}


def experts_body(t: dict) -> dict:
    from neuronx_distributed.modules.moe.experts import Experts
    from nxd_core_parallel import parallel_state

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=2)
    rank, i = parallel_state.get_tensor_model_parallel_rank(), INTER // 2
    mine = torch.cat([t["gu"][:, :, rank * i:(rank + 1) * i], t["gu"][:, :, INTER + rank * i:INTER + (rank + 1) * i]],
                     dim=2)  # stride 2: this rank's gate columns, then its up columns
    got = {}
    for glu_type, scale, act_bias, gate_max, up_clamp in GLU_CASES:
        experts = Experts(num_experts=E, hidden_size=H, intermediate_size=INTER, glu=True,
                          activation_fn=torch.nn.functional.silu, dtype=torch.float32, device=torch.device("cpu"),
                          glu_type=glu_type, hidden_act_scaling_factor=scale, hidden_act_bias=act_bias,
                          gate_clamp_upper_limit=gate_max, up_clamp_lower_limit=up_clamp[0],
                          up_clamp_upper_limit=up_clamp[1])
        with torch.no_grad():
            experts.gate_up_proj.weight.copy_(mine)
            experts.down_proj.weight.copy_(t["w2"][:, rank * i:(rank + 1) * i])
        x = t["x"][:, 0].clone().requires_grad_(True)
        out = experts(x)  # this rank's partial sum over its intermediate slice (NxD reduces after the combine)
        full = out.detach().clone()
        torch.distributed.all_reduce(full)
        (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
        # dL/dx is whole on each rank: the column layer all-reduces it over TP in its backward (NxD's)
        got[glu_type] = {"out": full, "x": x.grad, "gu": experts.gate_up_proj.weight.grad,
                         "w2": experts.down_proj.weight.grad}
    return got


def test_nxd_experts_glu_and_swiglu_match_one_process(rank_pool):
    t = {**_weights(), "gu": torch.randn(E, H, 2 * INTER, generator=torch.Generator().manual_seed(1))}
    want = {case[0]: _glu_reference(t, *case) for case in GLU_CASES}
    i = INTER // 2
    for rank, got in enumerate(rank_pool(2).run(experts_body, t)):
        cols = torch.cat([torch.arange(rank * i, (rank + 1) * i), INTER + torch.arange(rank * i, (rank + 1) * i)])
        for glu_type, ref in want.items():
            close = dict(rtol=1e-5, atol=1e-5)  # fp32, <= 12-term sums, 2 ranks summed in another order
            torch.testing.assert_close(got[glu_type]["out"], ref["out"], **close)
            torch.testing.assert_close(got[glu_type]["x"], ref["x"], **close)
            torch.testing.assert_close(got[glu_type]["gu"], ref["gu"][:, :, cols], **close)
            torch.testing.assert_close(got[glu_type]["w2"], ref["w2"][:, rank * i:(rank + 1) * i], **close)
