"""The ``zero1`` factory behind nxd.initialize_parallel_optimizer: config validation and the
bf16 precision modes (fp32 master weights, fp32 grad accumulation, stochastic rounding)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import nxd
from nxd_zero1 import NeuronZero1Optimizer


def test_zero1_is_registered():
    assert nxd.get_component("optimizer", "zero1").__module__ == "nxd_zero1.factory"


@pytest.mark.parametrize("mp,match", [
    ({"use_master_weight": True}, "unknown key 'use_master_weight'.*use_master_weights"),
    ({"stochastic_rounding": 1}, r"mixed_precision_config.stochastic_rounding must be True or False"),
    ({"use_fp32_grad_acc": "yes"}, r"mixed_precision_config.use_fp32_grad_acc must be True or False"),
])
def test_bad_mixed_precision_config_is_rejected(mp, match):
    with pytest.raises(nxd.ConfigError, match=match):
        nxd.neuronx_distributed_config(optimizer_config={"zero_one_enabled": True}, mixed_precision_config=mp)


def test_good_mixed_precision_config_passes():
    cfg = nxd.neuronx_distributed_config(
        optimizer_config={"zero_one_enabled": True},
        mixed_precision_config={"use_master_weights": True, "use_fp32_grad_acc": True,
                                "use_master_weights_in_ckpt": True, "stochastic_rounding": True})
    assert cfg["mixed_precision_config"]["stochastic_rounding"] is True


def bf16_body() -> dict:
    cfg = nxd.neuronx_distributed_config(
        optimizer_config={"zero_one_enabled": True, "grad_clipping": False},
        mixed_precision_config={"use_master_weights": True, "use_fp32_grad_acc": True,
                                "use_master_weights_in_ckpt": True, "stochastic_rounding": True},
    )
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4).to(torch.bfloat16)
    twin = torch.nn.Linear(8, 4).to(torch.bfloat16)  # same weights, no hooks: the grad oracle
    twin.load_state_dict(model.state_dict())
    opt = nxd.initialize_parallel_optimizer(cfg, torch.optim.AdamW, model.parameters(), lr=1e-3)
    assert isinstance(opt, NeuronZero1Optimizer) and opt.stochastic_rounding and opt.save_master_weights
    g = torch.Generator().manual_seed(dist.get_rank())
    expected = [torch.zeros(p.shape) for p in twin.parameters()]
    for _ in range(3):  # three micro-batches accumulate into fp32 main_grad
        x = torch.randn(5, 8, generator=g).to(torch.bfloat16)
        model(x).float().pow(2).sum().backward()
        twin.zero_grad()
        twin(x).float().pow(2).sum().backward()
        for e, p in zip(expected, twin.parameters()):
            e += p.grad.float()
    out = {"grad_is_none": all(p.grad is None for p in model.parameters()),
           "main_grad_dtypes": {str(p.main_grad.dtype) for p in model.parameters()},
           "main_grad_err": max(float((p.main_grad - e).abs().max()) for p, e in zip(model.parameters(), expected))}
    before = [p.detach().float().clone() for p in model.parameters()]
    opt.step()
    flat = torch.cat([p.detach().float().reshape(-1) for p in model.parameters()])
    master = opt._shards[0][: flat.numel() // 2] if dist.get_rank() == 0 else None
    out["master_dtype"] = str(opt._shards[0].dtype)
    out["moved"] = any(not torch.equal(b, p.float()) for b, p in zip(before, model.parameters()))
    if master is not None:
        # params are a stochastic rounding of the fp32 master: within one bf16 spacing of it
        spacing = torch.ldexp(torch.ones_like(master), torch.frexp(master).exponent - 8)
        out["within_one_ulp"] = bool(((flat[: master.numel()] - master).abs() < spacing).all())
    opt.zero_grad()
    out["zeroed"] = all(float(p.main_grad.abs().max()) == 0 for p in model.parameters())
    sd = opt.state_dict()
    out["ckpt_has_master"] = "master_weights" in sd
    return out


def test_bf16_master_weights_fp32_grad_acc_and_sr_through_the_facade(rank_pool):
    for r, out in enumerate(rank_pool(2).run(bf16_body)):
        assert out["grad_is_none"] and out["main_grad_dtypes"] == {"torch.float32"}
        assert out["main_grad_err"] < 1e-5, out  # fp32 sum of the same bf16 micro-batch grads
        assert out["master_dtype"] == "torch.float32" and out["moved"] and out["zeroed"] and out["ckpt_has_master"]
        if r == 0:
            assert out["within_one_ulp"]


def train_with_scheduler(zero1: bool, gamma: float = 0.3) -> list[torch.Tensor]:
    torch.manual_seed(1)
    model = torch.nn.Linear(6, 3)
    if zero1:
        opt = NeuronZero1Optimizer(model.parameters(), torch.optim.AdamW, lr=0.1, grad_clipping=False)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=gamma)
    g = torch.Generator().manual_seed(9)
    for _ in range(4):
        x = torch.randn(4, 6, generator=g)
        opt.zero_grad()
        model(x).pow(2).mean().backward()  # same data on both ranks: the DP average is the same grad
        opt.step()
        sched.step()
    return [p.detach().clone() for p in model.parameters()]


def test_lr_scheduler_drives_the_sharded_step(rank_pool):
    expected = train_with_scheduler(False)
    for got in rank_pool(2).run(train_with_scheduler, True):
        for a, b in zip(got, expected):
            assert torch.allclose(a, b, rtol=1e-6, atol=1e-7)
    # the schedule matters: a constant lr ends far away, so ignoring the scheduler would fail above
    constant = train_with_scheduler(False, gamma=1.0)
    assert (constant[0] - expected[0]).abs().max() > 1e-2
