"""Save ZeRO-1 state at DP=2, load it at DP=4 and DP=1 (resharding), and training continues with
the losses an uninterrupted DP=2 run has. Both NxD's save/load_sharded_state_dict and the
nxd.save_checkpoint/load_checkpoint facade (nxd-ckpt) are exercised."""

from __future__ import annotations

import copy
import os

import pytest
import torch
import torch.distributed as dist

import nxd
from nxd_core_parallel import parallel_state as ps
from nxd_testing.reference import train_data_parallel

IN, HIDDEN, OUT, GLOBAL_BATCH = 6, 7, 3, 8  # 73 params: padded differently at DP 1, 2 and 4
FIRST, THEN, LR = 4, 4, 2e-2


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, OUT))


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(50 + step)
    x = torch.randn(GLOBAL_BATCH, IN, generator=g)
    return x, torch.sin(x[:, :OUT] * 2)


def setup() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    cfg = nxd.neuronx_distributed_config(
        optimizer_config={"zero_one_enabled": True, "grad_clipping": True, "max_grad_norm": 0.5})
    model = make_model()
    opt = nxd.initialize_parallel_optimizer(cfg, torch.optim.AdamW, model.parameters(), lr=LR, weight_decay=0.1)
    return model, opt


def train(model, opt, steps: range) -> list[float]:
    """Global-batch mean losses; each DP rank takes its slice of the same global batch."""
    return train_data_parallel(model, opt, map(batch, steps), group=ps.get_data_parallel_group(),
                               loss_of=lambda m, rows: torch.nn.functional.mse_loss(m(rows[0]), rows[1])).losses


def save_body(root: str) -> dict:
    model, opt = setup()
    train(model, opt, range(FIRST))
    opt.save_sharded_state_dict(os.path.join(root, "sharded"))
    nxd.save_checkpoint(os.path.join(root, "ckpt"), tag="step4", model=model, optimizer=opt)
    if dist.get_rank() == 0:
        torch.save(model.state_dict(), os.path.join(root, "model.pt"))
    shard = copy.deepcopy(opt.state_dict())  # state_dict aliases live state, as torch's does
    dist.barrier()
    return {"shard": shard, "continued": train(model, opt, range(FIRST, FIRST + THEN))}


def resume_body(root: str, how: str, shards: list[dict] | None = None) -> dict:
    model, opt = setup()
    if how == "facade":
        nxd.load_checkpoint(os.path.join(root, "ckpt"), tag="step4", model=model, optimizer=opt)
    else:
        model.load_state_dict(torch.load(os.path.join(root, "model.pt")))
        opt.reload_master_weights_from_params()
        if how == "sharded_dir":
            opt.load_sharded_state_dict(os.path.join(root, "sharded"))
        elif how == "shards":
            opt.load_state_dict_from_shards(shards)
        elif how != "fresh_optimizer":
            raise ValueError(how)
    shard = copy.deepcopy(opt.state_dict())  # state_dict aliases live state, as torch's does
    return {"shard": shard, "continued": train(model, opt, range(FIRST, FIRST + THEN))}


def full_state(shards: list[dict], key: str) -> torch.Tensor:
    """Concatenate one state tensor of group 0 over the DP shards, padding dropped."""
    shards = sorted(shards, key=lambda s: s["dp_rank"])
    numel = shards[0]["groups"][0]["numel"]
    return torch.cat([s["state"][0][key] for s in shards])[:numel]


def rel(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) / abs(y) for x, y in zip(a, b))


@pytest.fixture(scope="module")
def saved(rank_pool, tmp_path_factory):
    root = str(tmp_path_factory.mktemp("zero1ckpt"))
    return root, rank_pool(2).run(save_body, root)


def test_dp2_to_dp2_round_trip_is_exact(rank_pool, saved):
    root, results = saved
    for how in ("sharded_dir", "facade"):
        loaded = rank_pool(2).run(resume_body, root, how)
        for before, after in zip(results, loaded):
            for key in ("exp_avg", "exp_avg_sq"):
                assert torch.equal(before["shard"]["state"][0][key], after["shard"]["state"][0][key])
            # same ranks, same reduction order: continuation is bitwise identical
            assert after["continued"] == before["continued"], how


def bad_shards_body(shards: list[dict]) -> list[str]:
    _, opt = setup()
    errors = []
    for bad in (shards[:1], [{"nope": 1}], [dict(shards[0], groups=[dict(shards[0]["groups"][0], numel=5)]), shards[1]]):
        try:
            opt.load_state_dict_from_shards(bad)
        except ValueError as exc:
            errors.append(str(exc))
    try:
        opt.load_state_dict(shards[1 - dist.get_rank()])
    except ValueError as exc:
        errors.append(str(exc))
    return errors


def test_bad_shards_give_clear_errors(rank_pool, saved):
    _, results = saved
    errors = rank_pool(2).run(bad_shards_body, [r["shard"] for r in results])[0]
    assert len(errors) == 4
    assert "DP ranks [1] are missing" in errors[0]
    assert "not a ZeRO-1 optimizer state dict" in errors[1]
    assert "param group 0" in errors[2] and "5 elements" in errors[2]
    assert "load_state_dict_from_shards" in errors[3]


def test_dp2_to_dp1_reshards_and_continues(rank_pool, saved):
    root, results = saved
    expected = results[0]["continued"]
    shards = [r["shard"] for r in results]
    for how, args in (("shards", (shards,)), ("sharded_dir", ()), ("facade", ())):
        (loaded,) = rank_pool(1).run(resume_body, root, how, *args)
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(full_state([loaded["shard"]], key), full_state(shards, key))
        worst = rel(loaded["continued"], expected)
        print(f"DP=2 -> DP=1 via {how}: max rel loss diff {worst:.2e}")
        assert worst < 1e-6


@pytest.mark.slow
def test_dp2_to_dp4_reshards_and_continues(rank_pool, saved):
    root, results = saved
    expected = results[0]["continued"]
    for how in ("sharded_dir", "facade"):
        loaded = rank_pool(4).run(resume_body, root, how)
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(full_state([r["shard"] for r in loaded], key), full_state([r["shard"] for r in results], key))
        assert all(r["shard"]["dp_size"] == 4 for r in loaded)
        worst = rel(loaded[0]["continued"], expected)
        print(f"DP=2 -> DP=4 via {how}: max rel loss diff {worst:.2e}")
        assert worst < 1e-6
    fresh = rank_pool(4).run(resume_body, root, "fresh_optimizer")[0]["continued"]
    assert rel(fresh, expected) > 1e-3  # without the optimizer state the run visibly diverges
