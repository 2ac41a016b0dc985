"""NxD's optimizer state loads at another TP (and DP) than it was written at, exactly.

The files are laid out as NxD's ``trainer/checkpoint.py`` ``save_checkpoint`` writes them (Release
2.29): per TP rank ``optim/dp_rank_DD_tp_rank_TT_pp_rank_00.pt``; without ZeRO-1 DP rank 0 writes
``optimizer.state_dict()`` (``_save(..., groups=get_data_parallel_replica_groups())``), with ZeRO-1
every DP rank writes its torch-xla ``ZeroRedundancyOptimizer.state_dict()`` (``_get_path("optim",
dp=True)``: ``base_state``/``shape_info``/``sharded_master_weights``, each tensor of the rank's
parameter shard padded along dim 0 to a multiple of DP and chunked). The TP shards are cut as NxD's
layers cut their parameters (ColumnParallelLinear rows, RowParallelLinear columns, contiguous).
Oracle: one single-process AdamW run; its state, cut for the loading TP, must be what the loaded
optimizer holds, bit for bit. (The files' fp32 master weights reshard alike; nxd-zero1 keeps no
master copy of fp32 parameters, so they are not compared.)
"""

from __future__ import annotations

import copy
import os

import pytest
import torch
import torch.nn.functional as F

import nxd
from nxd_ckpt import CheckpointError

SHARD = "dp_rank_{:02d}_tp_rank_{:02d}_pp_rank_00.pt"
LR, DECAY, KEYS = 2e-2, 0.1, ("exp_avg", "exp_avg_sq")
#: the partition dim of each parameter of _model() (Column rows, Row columns)
DIMS = {"up.weight": 0, "up.bias": 0, "down.weight": 1}


def _model() -> torch.nn.Module:
    from nxd_tensor_parallel.parallel_layers import ColumnParallelLinear, RowParallelLinear

    torch.manual_seed(0)
    model = torch.nn.Module()
    model.up = ColumnParallelLinear(4, 6, bias=True, gather_output=False)  # 3 rows a TP=2 rank: padded at DP=2
    model.down = RowParallelLinear(6, 4, bias=False, input_is_parallel=True)
    return model


def _trained() -> tuple[dict[str, torch.Tensor], dict[str, dict]]:
    """The TP=1 weights and per-parameter AdamW state after 3 steps, in one process."""
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=DECAY)
    for step in range(3):
        x = torch.randn(8, 4, generator=torch.Generator().manual_seed(step))
        opt.zero_grad()
        F.mse_loss(model.down(torch.tanh(model.up(x))), x).backward()
        opt.step()
    return ({k: v.detach().clone() for k, v in model.state_dict().items()},
            {n: copy.deepcopy(opt.state[p]) for n, p in model.named_parameters()})


def _cut(name: str, full: torch.Tensor, tp: int, rank: int) -> torch.Tensor:
    return full.chunk(tp, DIMS[name])[rank].clone() if full.dim() > 0 else full.clone()


def _xla_chunk(full: torch.Tensor, dp: int, rank: int) -> torch.Tensor:
    """torch-xla's ``_pad_to_world_size`` + ``_shard_tensor``."""
    if full.size(0) % dp:
        full = F.pad(full, [0, 0] * (full.dim() - 1) + [0, dp - full.size(0) % dp])
    return full.chunk(dp)[rank].clone()


def write_nxd_tag(root: str, weights: dict, state: dict, tp: int, dp: int | None) -> None:
    """NxD's files of a run at TP=``tp``: ZeRO-1 over ``dp`` DP ranks, or no ZeRO-1 (``dp=None``)."""
    names = list(DIMS)
    groups = [{"lr": LR, "weight_decay": DECAY, "params": list(range(len(names)))}]
    for kind in ("model", "optim"):
        os.makedirs(os.path.join(root, "t", kind), exist_ok=True)
    for r in range(tp):
        torch.save({n: _cut(n, w, tp, r) for n, w in weights.items()}, os.path.join(root, "t", "model", SHARD.format(0, r)))
        local = [{k: _cut(n, v, tp, r) for k, v in state[n].items()} for n in names]
        if dp is None:  # torch's Optimizer.state_dict() (AdamW: step a 0-dim tensor)
            sd = {"state": dict(enumerate(local)), "param_groups": copy.deepcopy(groups)}
            torch.save(sd, os.path.join(root, "t", "optim", SHARD.format(0, r)))
            continue
        for d in range(dp):  # NxD's AdamW_FP32OptimParams keeps step as a Python int
            sd = {"state": {}, "param_groups": copy.deepcopy(groups),
                  "base_state": {i: {k: (_xla_chunk(v, dp, d) if k in KEYS else int(v)) for k, v in s.items()}
                                 for i, s in enumerate(local)},
                  "shape_info": {i: _cut(n, weights[n], tp, r).shape for i, n in enumerate(names)},
                  "sharded_master_weights": {i: _xla_chunk(_cut(n, weights[n], tp, r), dp, d) for i, n in enumerate(names)},
                  "dp_rank": d, "tp_rank": r}
            torch.save(sd, os.path.join(root, "t", "optim", SHARD.format(d, r)))


def test_nxd_plain_optimizer_state_of_tp2_loads_at_tp1(tmp_path):
    weights, state = _trained()
    write_nxd_tag(str(tmp_path), weights, state, tp=2, dp=None)
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1.0)
    nxd.load_checkpoint(str(tmp_path), tag="t", model=model, optimizer=opt)
    assert opt.param_groups[0]["lr"] == LR
    for n, p in model.named_parameters():
        assert torch.equal(p.detach(), weights[n]), n
        for k in KEYS:
            assert torch.equal(opt.state[p][k], state[n][k]), (n, k)
        assert float(opt.state[p]["step"]) == 3
    with pytest.raises(CheckpointError, match="reshards like the model's parameters: pass the model too"):
        nxd.load_checkpoint(str(tmp_path), tag="t", optimizer=opt)


def zero1_load_body(root: str, tp: int) -> dict:
    from nxd_core_parallel import parallel_state
    from nxd_zero1.xla_layout import xla_state_dict

    cfg = nxd.neuronx_distributed_config(tensor_parallel_size=tp,
                                         optimizer_config={"zero_one_enabled": True, "grad_clipping": False})
    model = _model()
    opt = nxd.initialize_parallel_optimizer(cfg, torch.optim.AdamW, model.parameters(), lr=1.0)
    nxd.load_checkpoint(root, tag="t", model=model, optimizer=opt)
    # NxD's layout of what the optimizer holds, gathered over DP (each shard's chunks joined)
    xla = xla_state_dict(opt)
    out = {"tp_rank": parallel_state.get_tensor_model_parallel_rank(), "dp": parallel_state.get_data_parallel_size(),
           "xla": xla, "lr": opt.param_groups[0]["lr"]}
    parallel_state.destroy_model_parallel()
    return out


@pytest.mark.parametrize("saved_tp,saved_dp,tp", [(2, 2, 1), (1, 2, 2)])
def test_nxd_zero1_optimizer_state_reshards_across_tp_and_dp(rank_pool, tmp_path, saved_tp, saved_dp, tp):
    weights, state = _trained()
    write_nxd_tag(str(tmp_path), weights, state, tp=saved_tp, dp=saved_dp)
    out = rank_pool(2).run(zero1_load_body, str(tmp_path), tp)
    dp = 2 // tp
    for r in out:
        assert r["dp"] == dp and r["lr"] == LR
        for i, n in enumerate(DIMS):
            got = r["xla"]["base_state"][i]
            full = {k: _cut(n, state[n][k], tp, r["tp_rank"]) for k in KEYS}
            chunk = {k: _xla_chunk(full[k], dp, r["xla"]["dp_rank"]) for k in KEYS}
            assert all(torch.equal(got[k], chunk[k]) for k in KEYS), (n, r["tp_rank"], r["xla"]["dp_rank"])
            assert float(got["step"]) == 3


def test_use_zero1_dcp_needs_a_zero1_optimizer(tmp_path):
    model = _model()
    with pytest.raises(CheckpointError, match="use_zero1_dcp=True writes NxD's ZeRO-1 layout and needs a ZeRO-1 "
                                              "optimizer .* got AdamW"):
        nxd.save_checkpoint(str(tmp_path), "t", model=model, optimizer=torch.optim.AdamW(model.parameters()),
                            use_zero1_dcp=True)
