"""FSDP checkpoints through nxd-ckpt (atomic commit, checksums, async, retention): exact resume,
and resharding FSDP=2 -> TP=2 (plain data parallel) -> FSDP=4, weights bit-exact."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
from fsdp_models import LR, MAX_NORM, batch, build, full_params, held_bytes, unsharded_bytes

import nxd
import nxd_fsdp

STEPS_BEFORE, STEPS_AFTER = 3, 3


def setup(tp: int = 1, fsdp: bool = True):
    cfg = nxd.neuronx_distributed_config(tensor_parallel_size=tp, fsdp_config=True if fsdp else None,
                                         optimizer_config={"grad_clipping": True, "max_grad_norm": MAX_NORM})
    ctx = nxd.get_parallel_context()
    if not fsdp:
        model = nxd.initialize_parallel_model(cfg, build)
        return ctx, model, nxd.initialize_parallel_optimizer(cfg, torch.optim.AdamW, model.parameters(), lr=LR)
    model = nxd_fsdp.shard(build(), ctx, cfg)
    return ctx, model, nxd_fsdp.make_optimizer(cfg, torch.optim.AdamW, model.parameters(), context=ctx, lr=LR)


def train(ctx, model, opt, steps: range, keep_grads: bool = False) -> list[float]:
    losses = []
    for step in steps:
        ids, labels = batch(step)
        per = ids.shape[0] // ctx.dp.size
        rows = slice(ctx.dp.rank * per, (ctx.dp.rank + 1) * per)
        loss = model.run_train(ids[rows], labels[rows]).clone()
        opt.step()
        if not (keep_grads and step == steps[-1]):
            opt.zero_grad()
        dist.all_reduce(loss, group=ctx.dp.group)
        losses.append(float(loss) / ctx.dp.size)
    return losses


def resume_body(path: str) -> tuple[list[float], list[float], list[str]]:
    ctx, model, opt = setup()
    train(ctx, model, opt, range(STEPS_BEFORE - 1))
    nxd.save_checkpoint(path, tag="early", model=model, optimizer=opt, num_kept_ckpts=1, async_save=True)
    train(ctx, model, opt, range(STEPS_BEFORE - 1, STEPS_BEFORE))
    nxd.save_checkpoint(path, tag="resume", model=model, optimizer=opt, num_kept_ckpts=1, async_save=True)
    straight = train(ctx, model, opt, range(STEPS_BEFORE, STEPS_BEFORE + STEPS_AFTER))
    nxd.finalize_checkpoint()
    ctx, model, opt = setup()
    nxd.load_checkpoint(path, model=model, optimizer=opt)  # the newest complete tag
    resumed = train(ctx, model, opt, range(STEPS_BEFORE, STEPS_BEFORE + STEPS_AFTER))
    return straight, resumed, sorted(os.listdir(os.path.join(path, "resume", "optim")))


def test_resume_is_exact_with_async_save_and_retention(rank_pool, tmp_path):
    path = str(tmp_path / "ckpt")
    for straight, resumed, optim_files in rank_pool(2).run(resume_body, path):
        assert resumed == straight, (resumed, straight)  # bit-exact
        assert len(optim_files) == 2  # one optimizer shard per DP rank
    assert sorted(os.listdir(path)) == ["newest", "resume"]  # retention kept one


def save_body(path: str, tp: int, fsdp: bool, load_from: str | None) -> dict[str, torch.Tensor] | None:
    ctx, model, opt = setup(tp, fsdp)
    if load_from is None:
        train(ctx, model, opt, range(STEPS_BEFORE))
    else:
        nxd.load_checkpoint(load_from, model=model, optimizer=None)
    nxd.save_checkpoint(path, tag="t", model=model, optimizer=opt if load_from is None else None)
    params = full_params(model, ctx.tp.group)
    return params if ctx.rank == 0 else None


def load_body(path: str, tp: int, fsdp: bool, optimizer: bool) -> tuple[dict | None, list[float]]:
    ctx, model, opt = setup(tp, fsdp)
    nxd.load_checkpoint(path, model=model, optimizer=opt if optimizer else None)
    params = full_params(model, ctx.tp.group)
    losses = train(ctx, model, opt, range(STEPS_BEFORE, STEPS_BEFORE + STEPS_AFTER), keep_grads=True)
    return (params if ctx.rank == 0 else None), losses, held_bytes(model, opt)


@pytest.fixture(scope="session")
def reshard_chain(rank_pool, tmp_path_factory):
    """FSDP=2 trains and saves; TP=2 (plain DP, DP=1) loads those weights and saves them again."""
    root = tmp_path_factory.mktemp("reshard")
    fsdp2, tp2 = str(root / "fsdp2"), str(root / "tp2")
    saved = rank_pool(2).run(save_body, fsdp2, 1, True, None)[0]
    resaved = rank_pool(2).run(save_body, tp2, 2, False, fsdp2)[0]
    return fsdp2, tp2, saved, resaved


def test_fsdp2_weights_load_exactly_at_tp2(reshard_chain):
    _, _, saved, resaved = reshard_chain
    assert saved.keys() == resaved.keys()
    for name in saved:
        assert torch.equal(saved[name], resaved[name]), name


@pytest.mark.four_ranks
@pytest.mark.slow
def test_tp2_weights_then_fsdp2_optimizer_load_at_fsdp4(rank_pool, reshard_chain):
    fsdp2, tp2, saved, _ = reshard_chain
    params, _, _ = rank_pool(4).run(load_body, tp2, 1, True, False)[0]
    for name in saved:
        assert torch.equal(saved[name], params[name]), name
    # optimizer state saved at FSDP=2 reshards to FSDP=4; the run goes on as FSDP=2 would
    results = rank_pool(4).run(load_body, fsdp2, 1, True, True)
    on4 = results[0][1]
    whole = unsharded_bytes()
    for *_, held in results:  # FSDP=4: every rank holds a quarter of params, grads and optimizer state
        assert held == {k: v // 4 for k, v in whole.items()}, (held, whole)
    print(f"FSDP=4: per rank {results[0][2]} of unsharded {whole}")
    on2 = _REF_CONTINUE.get("losses") or rank_pool(2).run(load_body, fsdp2, 1, True, True)[0][1]
    worst = max(abs(a - b) / abs(b) for a, b in zip(on4, on2))
    print(f"FSDP=2 checkpoint resumed at FSDP=4 vs at FSDP=2: max rel loss diff over {STEPS_AFTER} steps {worst:.2e}")
    assert worst < 1e-5


_REF_CONTINUE: dict = {}


def test_fsdp2_checkpoint_resumes_at_fsdp2(rank_pool, reshard_chain):
    fsdp2 = reshard_chain[0]
    _REF_CONTINUE["losses"] = rank_pool(2).run(load_body, fsdp2, 1, True, True)[0][1]
