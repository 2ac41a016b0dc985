"""NxD's ZeRO-1 optimizer state written with torch.distributed.checkpoint loads into nxd-zero1.

NxD's ``save_checkpoint(async_save=True, use_zero1_dcp=True)`` hands ``<tag>/optim`` to
``optimizer/zero_dcp_utils.save_optim_state_dict`` (vendored unchanged): each DP rank's torch-xla
ZeRO-1 shard becomes a DCP ``ShardedTensor`` per state tensor, keyed by parameter name (plus
``|tp-NNNN`` / ``|pp-NNNN`` at TP/PP > 1). Here NxD's function writes it from the shards torch-xla's
rules make of a plain AdamW's state (pad dim 0 to a multiple of DP, rank r keeps chunk r) on 2
gloo ranks; ``nxd.load_checkpoint`` of the tag (NxD's model file beside it, no ``done``) must give
the DP=2 nxd-zero1 optimizer that state exactly, i.e. NxD's own shards back from ``xla_state_dict``.
"""

from __future__ import annotations

import copy
import os

import torch
import torch.nn.functional as F

KEYS = ("exp_avg", "exp_avg_sq")
LR = 2e-2


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    # dim 0 divisible by DP=2: NxD's _tensor_to_sharded_tensor computes the other ranks' chunk sizes
    # from the last rank's unpadded chunk, so NxD's DCP save fails on a padded parameter (7 rows: 5 of 7 covered)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 4))


def _xla_chunk(full: torch.Tensor, dp: int, rank: int) -> torch.Tensor:
    """torch-xla's ``_pad_to_world_size`` + ``_shard_tensor``."""
    if full.size(0) % dp:
        full = F.pad(full, [0, 0] * (full.dim() - 1) + [0, dp - full.size(0) % dp])
    return full.chunk(dp)[rank].clone()


def _nxd_shards(dp: int) -> tuple[dict, list[dict]]:
    """The model state and every DP rank's ``NeuronZero1Optimizer.state_dict()`` after 3 AdamW steps."""
    model = _model(0)
    plain = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.1)
    for step in range(3):
        x = torch.randn(8, 6, generator=torch.Generator().manual_seed(step))
        plain.zero_grad()
        F.mse_loss(model(x), x[:, :4]).backward()
        plain.step()
    params = list(model.parameters())
    groups = [{"lr": LR, "weight_decay": 0.1, "params": list(range(len(params)))}]
    shards = [{"state": {}, "param_groups": copy.deepcopy(groups), "shape_info": {i: p.shape for i, p in enumerate(params)},
               "base_state": {i: {k: (_xla_chunk(v, dp, r) if k in KEYS else v.clone()) for k, v in plain.state[p].items()}
                              for i, p in enumerate(params)}} for r in range(dp)]
    return {k: v.clone() for k, v in model.state_dict().items()}, shards


def nxd_dcp_save_body(root: str, model_state: dict, shards: list[dict]) -> list[str]:
    import torch.distributed as dist

    from neuronx_distributed.optimizer import zero_dcp_utils
    from neuronx_distributed.parallel_layers import parallel_state

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=1)
    model = _model(0)
    rank = dist.get_rank()
    # NxD's get_dcp_aux_infos(model, optimizer), from the optimizer's params and its state_dict's shape_info
    names = {i: n for i, (n, _) in enumerate(model.named_parameters())}
    aux = {"optim_pid_to_params": dict(enumerate(model.parameters())), "optim_pid_to_pnames": names,
           "shape_info": shards[rank]["shape_info"]}
    os.makedirs(os.path.join(root, "tag", "optim"), exist_ok=True)
    zero_dcp_utils.save_optim_state_dict(os.path.join(root, "tag", "optim"), shards[rank], aux)
    if rank == 0:  # NxD's model file of the tag (save_checkpoint's _save, torch format)
        os.makedirs(os.path.join(root, "tag", "model"), exist_ok=True)
        torch.save(model_state, os.path.join(root, "tag", "model", "dp_rank_00_tp_rank_00_pp_rank_00.pt"))
    dist.barrier()
    return sorted(os.listdir(os.path.join(root, "tag", "optim")))


def nxd_dcp_load_body(root: str) -> dict:
    import nxd
    from nxd_zero1.xla_layout import xla_state_dict

    cfg = nxd.neuronx_distributed_config(optimizer_config={"zero_one_enabled": True, "grad_clipping": False})
    from nxd_ckpt import CheckpointError

    model = _model(1)  # other weights: the load must replace them
    opt = nxd.initialize_parallel_optimizer(cfg, torch.optim.AdamW, model.parameters(), lr=LR, weight_decay=0.1)
    try:  # the state is keyed by parameter name: without the model nothing names the optimizer's parameters
        nxd.load_checkpoint(root, tag="tag", optimizer=opt)
        refusal = ""
    except CheckpointError as err:
        refusal = str(err)
    nxd.load_checkpoint(root, tag="tag", model=model, optimizer=opt, use_zero1_dcp=True)
    return {"xla": xla_state_dict(opt), "model": {k: v.clone() for k, v in model.state_dict().items()},
            "refusal": refusal}


def test_nxd_zero1_dcp_checkpoint_loads(rank_pool, tmp_path):
    model_state, shards = _nxd_shards(dp=2)
    files = rank_pool(2).run(nxd_dcp_save_body, str(tmp_path), model_state, shards)[0]
    assert ".metadata" in files and any(f.endswith(".distcp") for f in files), files
    out = rank_pool(2).run(nxd_dcp_load_body, str(tmp_path))
    for r, got in enumerate(out):
        assert "keyed by parameter name: pass the model too" in got["refusal"], got["refusal"]
        assert all(torch.equal(got["model"][k], v) for k, v in model_state.items())
        for i, want in shards[r]["base_state"].items():
            for k in KEYS:
                assert torch.equal(got["xla"]["base_state"][i][k], want[k]), (r, i, k)
            assert float(got["xla"]["base_state"][i]["step"]) == float(want["step"])
