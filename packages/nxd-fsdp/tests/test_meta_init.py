"""A meta-device build under FSDP: the model is built on the meta device, sharded by ``fully_shard``,
and only then materialised, each rank allocating its own shards. The initial weights must be the
unsharded build's, bit for bit (the initialiser runs on one module's whole tensors at a time and each
rank keeps its piece), at every DP size."""

from __future__ import annotations

import pytest
import torch
from fsdp_models import build, full_params, params_rel

import nxd
import nxd_fsdp
from nxd_core_parallel.model_init import reset_parameters


def build_body(meta: bool, tp: int = 1) -> tuple[dict | None, dict[str, torch.Tensor], list[str]]:
    from torch.distributed.tensor import DTensor

    init = {"meta_device_init": True, "param_init_fn": reset_parameters} if meta else None
    cfg = nxd.neuronx_distributed_config(tensor_parallel_size=tp, fsdp_config=True, model_init_config=init)
    ctx = nxd.get_parallel_context()
    model = nxd.initialize_parallel_model(cfg, build)
    assert isinstance(model, nxd_fsdp.FSDPModel)
    shards = {n: p.to_local().detach().clone() for n, p in model.named_parameters()}
    not_sharded = [n for n, p in model.named_parameters() if not isinstance(p, DTensor) or p.to_local().is_meta]
    whole = full_params(model, ctx.tp.group)  # collective
    return (whole if ctx.rank == 0 else None), shards, not_sharded


def check_meta_equals_plain(pool, tp: int = 1) -> None:
    plain = pool.run(build_body, False, tp, timeout=900)  # a busy 2-core host is slow
    meta = pool.run(build_body, True, tp, timeout=900)
    whole = {k: v.detach() for k, v in build().state_dict().items()}  # one process, no FSDP, no meta
    for rank, ((_, want, _), (_, got, not_sharded)) in enumerate(zip(plain, meta)):
        assert not not_sharded, (rank, not_sharded)
        assert want.keys() == got.keys()
        for name in want:
            assert torch.equal(got[name], want[name]), (rank, name)  # each rank's shard, bit for bit
    assert params_rel(meta[0][0], whole) == 0.0


def test_meta_build_dp2_equals_the_plain_build(rank_pool):
    check_meta_equals_plain(rank_pool(2))


@pytest.mark.four_ranks
@pytest.mark.parametrize("tp", [1, 2], ids=["dp4", "tp2_dp2"])
def test_meta_build_on_four_ranks_equals_the_plain_build(rank_pool, tp: int):
    # DP=4: the same weights cut in 4; TP=2 x FSDP=2: the TP layers' own sharded init on whole TP-local tensors
    check_meta_equals_plain(rank_pool(4), tp)
