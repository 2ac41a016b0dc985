"""The real nxd-zero1 optimizer through nxd.save_checkpoint / load_checkpoint: an async save at
DP=2 (training keeps mutating the state while it is written), resumed at DP=1 and DP=4, goes on as
the uninterrupted run would. Oracle: one fp64 AdamW run in this process over all the steps, each
step taken from the parallel run's own weights (teacher forcing), its moments carried across the
resume; every parallel weight must land within nxd_testing.reference.AdamWStepBound of it, and the
losses at the same weights within 1e-5. A resume without the optimizer state lands far outside."""

from __future__ import annotations

import pytest
import torch

import nxd
from nxd_core_parallel import parallel_state as ps
from nxd_testing.reference import AdamWStepBound, train_data_parallel, within_bound

IN, HIDDEN, OUT, BATCH = 5, 9, 2, 8  # 74 params: padded differently at DP 1, 2 and 4
FIRST, THEN, LR, DECAY, MAX_NORM = 3, 4, 3e-2, 0.1, 1.0
LOSS_TOL = 1e-5


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, OUT))


def setup() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    cfg = nxd.neuronx_distributed_config(optimizer_config={"zero_one_enabled": True, "grad_clipping": True,
                                                           "max_grad_norm": MAX_NORM})
    model = _model()
    opt = nxd.initialize_parallel_optimizer(cfg, torch.optim.AdamW, model.parameters(), lr=LR, weight_decay=DECAY)
    return model, opt


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(BATCH, IN, generator=torch.Generator().manual_seed(100 + step))
    return x, torch.cos(x[:, :OUT])


def loss_of(model: torch.nn.Module, rows: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return torch.nn.functional.mse_loss(model(rows[0]), rows[1])


def train(model: torch.nn.Module, opt: torch.optim.Optimizer, steps: range) -> dict:
    """Global-batch mean losses, and the weights before the first step and after each one; each DP
    rank takes its slice of the same global batch."""
    weights = [_weights(model)]
    run = train_data_parallel(model, opt, map(batch, steps), group=ps.get_data_parallel_group(), loss_of=loss_of,
                              after_step=lambda: weights.append(_weights(model)))
    return {"losses": run.losses, "weights": weights}


def _weights(model: torch.nn.Module) -> dict:
    return {k: v.detach().numpy().copy() for k, v in model.named_parameters()}  # plain arrays between processes


def save_body(path: str) -> dict:
    model, opt = setup()
    assert getattr(opt, "nxd_zero1", False), "expected nxd-zero1's optimizer"
    first = train(model, opt, range(FIRST))
    nxd.save_checkpoint(path, "step3", model=model, optimizer=opt, user_content={"step": FIRST}, async_save=True)
    continued = train(model, opt, range(FIRST, FIRST + THEN))  # mutates params and moments mid-write
    nxd.finalize_checkpoint()
    return {"first": first, "continued": continued}


def resume_body(path: str, load_optimizer: bool) -> dict:
    model, opt = setup()
    content = nxd.load_checkpoint(path, None, model=model, optimizer=opt if load_optimizer else None, load_rng=False)
    assert content == {"step": FIRST}
    if not load_optimizer:
        opt.reload_master_weights_from_params()
    return train(model, opt, range(FIRST, FIRST + THEN))


def teacher_forced(first: dict, then: dict) -> tuple[float, float]:
    """The fp64 reference over all FIRST + THEN steps, each from the parallel runs' weights (the
    saving run's, then ``then``'s from the resume on): (worst relative loss error, largest fraction
    of its AdamW step bound any weight used)."""
    ref = _model().double()
    opt = torch.optim.AdamW(ref.parameters(), lr=LR, weight_decay=DECAY)
    bound = AdamWStepBound(opt)
    params = dict(ref.named_parameters())
    losses = first["losses"] + then["losses"]
    trajectory = [{k: torch.from_numpy(w) for k, w in ws.items()} for ws in first["weights"] + then["weights"]]
    before = trajectory[:FIRST] + trajectory[FIRST + 1:-1]
    after = trajectory[1:FIRST + 1] + trajectory[FIRST + 2:]
    saved, loaded = trajectory[FIRST], trajectory[FIRST + 1]
    assert all(torch.equal(saved[k], loaded[k]) for k in saved)  # the resume loaded them
    worst_loss = worst_used = 0.0
    for step, (start, end) in enumerate(zip(before, after)):
        with torch.no_grad():
            for name, p in params.items():
                p.copy_(start[name])
        loss = loss_of(ref, tuple(t.double() for t in batch(step)))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(ref.parameters(), MAX_NORM)
        bound.grads_ready()
        opt.step()
        limits = bound.stepped()
        opt.zero_grad()
        want = float(loss.detach())
        worst_loss = max(worst_loss, abs(losses[step] - want) / want)
        used, _ = within_bound(end, {k: p.detach() for k, p in params.items()}, {k: limits[p] for k, p in params.items()})
        worst_used = max(worst_used, used)
    return worst_loss, worst_used


@pytest.fixture(scope="module")
def saved(rank_pool, tmp_path_factory) -> tuple[str, dict]:
    path = str(tmp_path_factory.mktemp("zero1_real"))
    runs = rank_pool(2).run(save_body, path)
    assert runs[0]["continued"]["losses"] == runs[1]["continued"]["losses"]
    loss_err, used = teacher_forced(runs[0]["first"], runs[0]["continued"])
    print(f"ZeRO-1 DP=2 uninterrupted: loss rel {loss_err:.1e}, weights used {used:.2f} of their AdamW step bound")
    assert loss_err <= LOSS_TOL and used <= 1.0
    return path, runs[0]["first"]


def test_dp2_save_has_one_optimizer_shard_per_dp_rank(saved):
    import json
    import os

    path, _ = saved
    assert sorted(os.listdir(os.path.join(path, "step3", "optim"))) == [
        "dp_rank_00_tp_rank_00_pp_rank_00.pt", "dp_rank_01_tp_rank_00_pp_rank_00.pt"]
    with open(os.path.join(path, "step3", "metadata.json")) as f:
        meta = json.load(f)
    assert meta["zero1"] is True and meta["degrees"]["dp"] == 2


def test_dp2_to_dp1_continues_as_the_uninterrupted_run(rank_pool, saved):
    path, first = saved
    (resumed,) = rank_pool(1).run(resume_body, path, True)
    loss_err, used = teacher_forced(first, resumed)
    print(f"ZeRO-1 DP=2 -> DP=1 over {THEN} steps: loss rel {loss_err:.1e}, weights used {used:.2f} of their bound")
    assert loss_err <= LOSS_TOL and used <= 1.0
    (fresh,) = rank_pool(1).run(resume_body, path, False)
    _, fresh_used = teacher_forced(first, fresh)
    print(f"... resumed without the optimizer state: weights used {fresh_used:.0f}x their bound")
    assert fresh_used > 100  # the optimizer state matters: without it the steps land far outside


@pytest.mark.slow
def test_dp2_to_dp4_continues_as_the_uninterrupted_run(rank_pool, saved):
    path, first = saved
    resumed = rank_pool(4).run(resume_body, path, True)
    loss_err, used = teacher_forced(first, resumed[0])
    print(f"ZeRO-1 DP=2 -> DP=4 over {THEN} steps: loss rel {loss_err:.1e}, weights used {used:.2f} of their bound")
    assert loss_err <= LOSS_TOL and used <= 1.0
