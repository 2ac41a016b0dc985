"""DCP interop: an FSDP run's state written with nxd_fsdp.save_dcp is read by plain
``torch.distributed.checkpoint`` in one process (what torchtitan does), a DCP checkpoint written by
one plain-torch process loads into FSDP=2, and a run resumed from its own DCP checkpoint is exact."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from fsdp_models import LR, MAX_NORM, batch, build, full_params

import nxd
import nxd_fsdp
from nxd_fsdp.dcp import load_dcp, save_dcp
from nxd_testing.reference import train_reference

STEPS = 3


def setup():
    cfg = nxd.neuronx_distributed_config(optimizer_config={"grad_clipping": True, "max_grad_norm": MAX_NORM},
                                         fsdp_config=True)
    ctx = nxd.get_parallel_context()
    model = nxd_fsdp.shard(build(), ctx, cfg)
    return ctx, model, nxd_fsdp.make_optimizer(cfg, torch.optim.AdamW, model.parameters(), context=ctx, lr=LR)


def train(ctx, model, opt, steps: range) -> list[float]:
    losses = []
    for step in steps:
        ids, labels = batch(step)
        per = ids.shape[0] // ctx.dp.size
        rows = slice(ctx.dp.rank * per, (ctx.dp.rank + 1) * per)
        loss = model.run_train(ids[rows], labels[rows]).clone()
        opt.step()
        opt.zero_grad()
        dist.all_reduce(loss)
        losses.append(float(loss) / ctx.dp.size)
    return losses


def save_body(path: str, foreign: str):
    ctx, model, opt = setup()
    train(ctx, model, opt, range(STEPS))
    save_dcp(path, model, opt, context=ctx)
    params = full_params(model)
    straight = train(ctx, model, opt, range(STEPS, STEPS + 2))
    ctx, model, opt = setup()
    load_dcp(path, model, opt, context=ctx)
    resumed = train(ctx, model, opt, range(STEPS, STEPS + 2))
    ctx, model, _ = setup()
    load_dcp(foreign, model, context=ctx)
    loaded = full_params(model)
    return (params, loaded) if ctx.rank == 0 else None, straight, resumed


def test_dcp_round_trips_with_plain_torch(rank_pool, tmp_path):
    # one plain-torch process writes a DCP checkpoint (no process group), as another code base would
    ref = build()
    train_reference(ref, torch.optim.AdamW(ref.parameters(), lr=LR), [batch(s) for s in range(STEPS)], max_norm=MAX_NORM)
    foreign = str(tmp_path / "foreign")
    dcp.save({k: v.detach().clone() for k, v in ref.state_dict().items()}, checkpoint_id=foreign)

    path = str(tmp_path / "run")
    results = rank_pool(2).run(save_body, path, foreign)
    (params, loaded), straight, resumed = results[0]
    assert results[1][1:] == (straight, resumed) and resumed == straight  # resume from DCP is bit-exact
    assert os.path.exists(os.path.join(path, ".metadata")) and not os.path.exists(path + ".partial")
    # what torchtitan does: plain DCP, one process, no process group, the model's names at the top level
    state = {k: torch.empty_like(v) for k, v in build().state_dict().items()}
    dcp.load(state, checkpoint_id=path)
    for name, value in params.items():
        assert torch.equal(state[name], value), name
    for name, value in ref.state_dict().items():  # and the reverse direction
        assert torch.equal(loaded[name], value), name
