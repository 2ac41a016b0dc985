"""PP=2 x FSDP=2 (4 gloo ranks): nxd-pipeline's 1F1B schedule over stages sharded by fully_shard,
against one process (fp32, AdamW, clipping acting): losses and every parameter after the steps."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from fsdp_models import params_rel

import nxd
import nxd_fsdp
from nxd_testing.reference import max_rel

STEPS, LR, MAX_NORM = 5, 1e-2, 0.5


def build():
    from nxd_pipeline.toy import ToyLM

    torch.manual_seed(0)
    return ToyLM(num_layers=4)


def batches() -> list[dict]:
    from nxd_pipeline.toy import toy_batch

    return [toy_batch(8, 6, seed=s % 2) for s in range(STEPS)]


def reference() -> tuple[list[float], dict]:
    model = build()
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    losses = []
    for batch in batches():
        loss = model(**batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


def pp_fsdp_body() -> tuple[list[float], dict, bool]:
    cfg = nxd.neuronx_distributed_config(pipeline_parallel_size=2, fsdp_config=True,
                                         pipeline_config={"num_microbatches": 2, "schedule": "1f1b"},
                                         optimizer_config={"grad_clipping": True, "max_grad_norm": MAX_NORM})
    ctx = nxd.get_parallel_context()
    model = nxd.initialize_parallel_model(cfg, build)
    opt = nxd.initialize_parallel_optimizer(cfg, torch.optim.AdamW, model.parameters(), lr=LR)
    assert isinstance(model, nxd_fsdp.FSDPModel)
    losses = []
    for batch in batches():
        mine = {k: v.chunk(ctx.dp.size)[ctx.dp.rank] for k, v in batch.items()}
        loss = model.run_train(**mine).clone()
        opt.step()
        opt.zero_grad()
        dist.all_reduce(loss, group=ctx.dp.group)
        losses.append(float(loss) / ctx.dp.size)
    stage = model.state_dict()  # this stage's parameters, DP-gathered, global names
    gathered: list = [None] * ctx.pp.size
    dist.all_gather_object(gathered, stage, group=ctx.pp.group)
    return losses, {k: v for part in gathered for k, v in part.items()}


@pytest.mark.four_ranks
@pytest.mark.slow
def test_pp2_fsdp2_matches_one_process(rank_pool):
    ref_losses, ref_params = reference()
    assert ref_losses[-1] < ref_losses[0]
    worst = 0.0
    for losses, params in rank_pool(4).run(pp_fsdp_body):
        worst = max(worst, max_rel(losses, ref_losses), params_rel(params, ref_params))
    print(f"PP=2 x FSDP=2 (1F1B, 2 micro-batches): max rel diff (losses, params after {STEPS} steps) {worst:.2e}")
    assert worst < 1e-5
