"""ZeRO-1 on 2 and 4 real gloo ranks against plain AdamW in one process (fp32)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from nxd_zero1 import NeuronZero1Optimizer

GLOBAL_BATCH, IN, HIDDEN, OUT = 8, 12, 23, 5  # 23: param count not a multiple of DP (padding)
STEPS = 20
HPARAMS = {"lr": 1e-2, "betas": (0.9, 0.99), "eps": 1e-8, "weight_decay": 0.05}


def make_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, OUT))


def batches(steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1234)
    teacher = torch.randn(IN, OUT, generator=g)  # a learnable target, so the loss really falls
    xs = [torch.randn(GLOBAL_BATCH, IN, generator=g) for _ in range(steps)]
    return [(x, torch.tanh(x @ teacher)) for x in xs]


def param_groups(model: torch.nn.Module) -> list[dict]:
    # Two groups (no weight decay on biases) to exercise per-group flat buffers.
    weights = [p for n, p in model.named_parameters() if n.endswith("weight")]
    biases = [p for n, p in model.named_parameters() if n.endswith("bias")]
    return [{"params": weights}, {"params": biases, "weight_decay": 0.0}]


def maybe_swap(model: torch.nn.Module, step: int, swap_at: int | None) -> None:
    """Replace a weight's storage mid-run, as weight loaders or tools doing ``p.data = ...`` do."""
    if step == swap_at:
        model[0].weight.data = model[0].weight.detach() * 0.5


def reference(steps: int, max_norm: float | None, swap_at: int | None = None) -> tuple[list[float], list[torch.Tensor]]:
    model = make_model()
    opt = torch.optim.AdamW(param_groups(model), **HPARAMS)
    losses = []
    for step, (x, y) in enumerate(batches(steps)):
        maybe_swap(model, step, swap_at)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        if max_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        opt.step()
        losses.append(loss.item())
    return losses, [p.detach().clone() for p in model.parameters()]


def zero1_body(steps: int, max_norm: float | None, reduce_impl: str,
               swap_at: int | None = None) -> tuple[list[float], list[torch.Tensor]]:
    rank, world = dist.get_rank(), dist.get_world_size()
    model = make_model()
    opt = NeuronZero1Optimizer(param_groups(model), torch.optim.AdamW, grad_clipping=max_norm is not None,
                               max_norm=max_norm or 1.0, reduce_impl=reduce_impl, **HPARAMS)
    local = GLOBAL_BATCH // world
    losses = []
    for step, (x, y) in enumerate(batches(steps)):
        maybe_swap(model, step, swap_at)
        # the swap run zeroes through the module (grads set to None), not through the optimizer
        (model if swap_at is not None else opt).zero_grad()
        xs, ys = x[rank * local:(rank + 1) * local], y[rank * local:(rank + 1) * local]
        loss = torch.nn.functional.mse_loss(model(xs), ys)
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses.append(mean.item() / world)
    return losses, [p.detach().clone() for p in model.parameters()]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def check(results, steps: int, max_norm: float | None, swap_at: int | None = None) -> float:
    ref_losses, ref_params = reference(steps, max_norm, swap_at)
    worst = 0.0
    for losses, params in results:
        worst = max(worst, max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses)))
        worst = max(worst, *(rel(p, r) for p, r in zip(params, ref_params)))
    # The first loss sees no update; it must agree to fp32 summation-order noise.
    assert abs(results[0][0][0] - ref_losses[0]) / ref_losses[0] < 1e-6
    assert ref_losses[-1] < 0.9 * ref_losses[0], "reference did not train; the comparison would be vacuous"
    return worst


@pytest.mark.parametrize("reduce_impl", ["all_reduce", "reduce_scatter"])
def test_dp2_matches_single_process_adamw(rank_pool, reduce_impl):
    worst = check(rank_pool(2).run(zero1_body, STEPS, None, reduce_impl), STEPS, None)
    print(f"DP=2 {reduce_impl}: max relative diff (losses, params) = {worst:.2e}")
    assert worst < 1e-6


def test_dp2_with_clipping_matches(rank_pool):
    # max_norm small enough that every step clips: the sharded norm must equal the unsharded one.
    worst = check(rank_pool(2).run(zero1_body, STEPS, 0.05, "auto"), STEPS, 0.05)
    print(f"DP=2 clipped: max relative diff = {worst:.2e}")
    assert worst < 1e-6


def test_replaced_param_storage_is_picked_up(rank_pool):
    # fp32 params and grads are views of flat buffers; a swapped param storage and grads set to
    # None by model.zero_grad() must be re-bound
    worst = check(rank_pool(2).run(zero1_body, STEPS, None, "auto", 5), STEPS, None, 5)
    print(f"DP=2 with a swapped param storage: max relative diff = {worst:.2e}")
    assert worst < 1e-6


def state_bytes_body() -> dict:
    """Bytes of optimizer state (AdamW exp_avg/exp_avg_sq) and fp32 master shard on this rank."""
    model = make_model()
    opt = NeuronZero1Optimizer(param_groups(model), torch.optim.AdamW, **HPARAMS)
    x, y = batches(1)[0]
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    state = sum(t.numel() * t.element_size() for s in opt.optim.state.values() for k, t in s.items() if k != "step")
    master = sum(s.numel() * s.element_size() for s in opt._shards)
    return {"state": state, "master": master}


def unsharded_state_bytes() -> int:
    model = make_model()
    opt = torch.optim.AdamW(param_groups(model), **HPARAMS)
    x, y = batches(1)[0]
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    return sum(t.numel() * t.element_size() for s in opt.state.values() for k, t in s.items() if k != "step")


@pytest.mark.parametrize("dp", [2, 4])
def test_optimizer_state_per_rank_is_one_over_dp(rank_pool, dp):
    full = unsharded_state_bytes()
    per_rank = rank_pool(dp).run(state_bytes_body)
    numels = [sum(p.numel() for p in g["params"]) for g in param_groups(make_model())]
    # exactly 1/DP of each group's flat buffer, which is padded up to a multiple of DP
    padded = sum(-(-n // dp) * dp for n in numels)
    for r in per_rank:
        assert r["state"] == 2 * 4 * padded // dp
        assert r["master"] == 4 * padded // dp
    ratio = per_rank[0]["state"] / full
    print(f"DP={dp}: AdamW state {per_rank[0]['state']} B/rank vs {full} B unsharded = {ratio:.4f} (1/DP = {1 / dp:.4f})")
    assert abs(ratio - 1 / dp) < 2 * dp / sum(numels)  # only the padding (< DP elements per group) differs


def test_dp4_matches_single_process_adamw(rank_pool):
    worst = check(rank_pool(4).run(zero1_body, STEPS, 0.05, "auto"), STEPS, 0.05)
    print(f"DP=4 clipped: max relative diff = {worst:.2e}")
    assert worst < 1e-6
