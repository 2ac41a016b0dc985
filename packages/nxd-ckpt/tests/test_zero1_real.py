"""The real nxd-zero1 optimizer through nxd.save_checkpoint / load_checkpoint: an async save at
DP=2 (training keeps mutating the state while it is written), resumed at DP=1 and DP=4, goes on
with the losses of the uninterrupted DP=2 run."""

from __future__ import annotations

import pytest
import torch

import nxd
from nxd_core_parallel import parallel_state as ps
from nxd_testing.reference import train_data_parallel

IN, HIDDEN, OUT, BATCH = 5, 9, 2, 8  # 74 params: padded differently at DP 1, 2 and 4
FIRST, THEN, LR = 3, 4, 3e-2


def setup() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    cfg = nxd.neuronx_distributed_config(optimizer_config={"zero_one_enabled": True, "grad_clipping": True,
                                                           "max_grad_norm": 1.0})
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, OUT))
    opt = nxd.initialize_parallel_optimizer(cfg, torch.optim.AdamW, model.parameters(), lr=LR, weight_decay=0.1)
    return model, opt


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(BATCH, IN, generator=torch.Generator().manual_seed(100 + step))
    return x, torch.cos(x[:, :OUT])


def train(model: torch.nn.Module, opt: torch.optim.Optimizer, steps: range) -> list[float]:
    """Global-batch mean losses; each DP rank takes its slice of the same global batch."""
    return train_data_parallel(model, opt, map(batch, steps), group=ps.get_data_parallel_group(),
                               loss_of=lambda m, rows: torch.nn.functional.mse_loss(m(rows[0]), rows[1])).losses


def save_body(path: str) -> list[float]:
    model, opt = setup()
    assert getattr(opt, "nxd_zero1", False), "expected nxd-zero1's optimizer"
    train(model, opt, range(FIRST))
    nxd.save_checkpoint(path, "step3", model=model, optimizer=opt, user_content={"step": FIRST}, async_save=True)
    continued = train(model, opt, range(FIRST, FIRST + THEN))  # mutates params and moments mid-write
    nxd.finalize_checkpoint()
    return continued


def resume_body(path: str, load_optimizer: bool) -> list[float]:
    model, opt = setup()
    content = nxd.load_checkpoint(path, None, model=model, optimizer=opt if load_optimizer else None, load_rng=False)
    assert content == {"step": FIRST}
    if not load_optimizer:
        opt.reload_master_weights_from_params()
    return train(model, opt, range(FIRST, FIRST + THEN))


def rel(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) / abs(y) for x, y in zip(a, b))


@pytest.fixture(scope="module")
def saved(rank_pool, tmp_path_factory) -> tuple[str, list[float]]:
    path = str(tmp_path_factory.mktemp("zero1_real"))
    continued = rank_pool(2).run(save_body, path)
    assert continued[0] == continued[1]
    return path, continued[0]


def test_dp2_save_has_one_optimizer_shard_per_dp_rank(saved):
    import json
    import os

    path, _ = saved
    assert sorted(os.listdir(os.path.join(path, "step3", "optim"))) == [
        "dp_rank_00_tp_rank_00_pp_rank_00.pt", "dp_rank_01_tp_rank_00_pp_rank_00.pt"]
    with open(os.path.join(path, "step3", "metadata.json")) as f:
        meta = json.load(f)
    assert meta["zero1"] is True and meta["degrees"]["dp"] == 2


def test_dp2_to_dp1_continues_with_the_same_losses(rank_pool, saved):
    path, expected = saved
    (resumed,) = rank_pool(1).run(resume_body, path, True)
    worst = rel(resumed, expected)
    print(f"ZeRO-1 DP=2 -> DP=1: max rel loss diff over {THEN} steps {worst:.2e}")
    assert worst < 1e-6
    (fresh,) = rank_pool(1).run(resume_body, path, False)
    assert rel(fresh, expected) > 1e-3  # the optimizer state matters: without it the run diverges


@pytest.mark.slow
def test_dp2_to_dp4_continues_with_the_same_losses(rank_pool, saved):
    path, expected = saved
    resumed = rank_pool(4).run(resume_body, path, True)
    worst = rel(resumed[0], expected)
    print(f"ZeRO-1 DP=2 -> DP=4: max rel loss diff over {THEN} steps {worst:.2e}")
    assert worst < 1e-6
