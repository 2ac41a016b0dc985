"""NxD's ``moe_parallel_layers`` (ExpertFusedColumnParallelLinear -> ExpertFusedRowParallelLinear, NxD's
constructor arguments) at TP=2 on 2 gloo ranks against one process computing NxD's math in plain
torch on the full weights: ``relu(x @ W1[e] + b1[e]) @ W2[e]`` per expert, output and gradients (input
and this rank's weight slices), with and without ``expert_indices``."""

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
