"""Aux-loss-free balancing through nxd's public entry points on 2 gloo ranks (EP=2, DP=2): an
optimizer from ``nxd.initialize_parallel_optimizer`` (plain and ZeRO-1) moves every router's
``e_score_correction_bias`` after each step by the paper's rule applied to the expert loads summed
over both ranks, and the biases stay identical on the ranks."""

from __future__ import annotations

import pytest
import torch


def balancer_body(zero1: bool, steps: int = 2) -> dict:
    import torch.distributed as dist

    import nxd
    from nxd_moe import biased_routers, expert_bias_update
    from nxd_testing.reference import random_lm_batch

    cfg = nxd.neuronx_distributed_config(tensor_parallel_size=1, expert_parallel_size=2,
                                         optimizer_config={"zero_one_enabled": zero1, "grad_clipping": False})
    spec = nxd.get_model("deepseek_v3")
    torch.manual_seed(0)
    model = nxd.build_parallel_model(spec, {"preset": "deepseek-v3-tiny", "bias_update_rate": 0.01}, cfg)
    opt = nxd.initialize_parallel_optimizer(cfg, torch.optim.AdamW, model.parameters(), lr=1e-3)
    routers = biased_routers(model)
    expected = [torch.zeros_like(r.e_score_correction_bias) for r in routers]
    for step in range(steps):
        data = random_lm_batch(10 * step + dist.get_rank(), 2, 16, 4096)
        model(data["input_ids"], labels=data["labels"]).loss.backward()
        loads = torch.stack([r.expert_load for r in routers])
        dist.all_reduce(loads)
        expected = [expert_bias_update(e, load, 0.01) for e, load in zip(expected, loads)]
        opt.step()
        opt.zero_grad()
    return {"bias": [r.e_score_correction_bias.clone() for r in routers], "expected": expected,
            "load_left": float(sum(r.expert_load.sum() for r in routers))}


@pytest.mark.parametrize("zero1", [False, True], ids=["plain", "zero1"])
def test_expert_bias_moves_by_the_paper_rule_after_each_step(rank_pool, zero1):
    results = rank_pool(2).run(balancer_body, zero1, timeout=180)
    for r in results:
        assert r["load_left"] == 0
        assert len(r["bias"]) == 2  # the tiny preset's two MoE layers
        for got, want in zip(r["bias"], r["expected"]):
            torch.testing.assert_close(got, want)
            assert got.abs().sum() > 0
    for a, b in zip(results[0]["bias"], results[1]["bias"]):
        assert torch.equal(a, b)
