"""NxD's own ZeRO-1 optimizer state (torch-xla's ``ZeroRedundancyOptimizer`` layout), read and written.

The fixture is built here from torch-xla's rules alone (``_shard_tensor``: pad dimension 0 to a
multiple of the DP size, DP rank r keeps chunk r; ``state_dict()`` adds ``base_state``,
``shape_info``, ``sharded_master_weights``) over the state of a plain single-process AdamW, and
written where NxD's ``save_checkpoint(use_xser=True)`` puts it
(``<tag>/optim/dp_rank_DD_tp_rank_TT_pp_rank_PP.pt`` as torch-xla xser files, plus NxD's
``.info.pt``). Oracle: that AdamW state, which the DP=2 ZeRO-1 optimizer must hold exactly after
``nxd.load_checkpoint``. Round trip: nxd-zero1 writes NxD's layout (equal to the rules applied to
its own gathered state) and reads it back at DP=2 and DP=1 bit for bit.
"""

from __future__ import annotations

import copy
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F

import nxd
from nxd_core_parallel import parallel_state as ps
from nxd_testing.reference import AdamWStepBound, train_data_parallel, within_bound

IN, HIDDEN, OUT, BATCH, LR, STEPS = 6, 7, 3, 8, 2e-2, 3  # dimension 0 of 7 and 3: padded at DP=2
KEYS = ("exp_avg", "exp_avg_sq")


def make_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, OUT))


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(70 + step)
    x = torch.randn(BATCH, IN, generator=g)
    return x, torch.sin(x[:, :OUT] * 2)


def loss_of(model: torch.nn.Module, rows: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return F.mse_loss(model(rows[0]), rows[1])


def xla_chunk(full: torch.Tensor, dp: int, rank: int) -> torch.Tensor:
    """torch-xla's ``_pad_to_world_size`` + ``_shard_tensor``."""
    if full.size(0) % dp:
        full = F.pad(full, [0, 0] * (full.dim() - 1) + [0, dp - full.size(0) % dp])
    return full.chunk(dp)[rank].clone()


def nxd_rule_shards(params: list[torch.Tensor], state: list[dict], groups: list[dict], dp: int) -> list[dict]:
    """Every DP rank's ``NeuronZero1Optimizer.state_dict()`` for full per-parameter ``state``."""
    shards = []
    for r in range(dp):
        # NxD's AdamW_FP32OptimParams keeps ``step`` as a Python int
        base = {i: {k: (xla_chunk(v, dp, r) if k in KEYS else int(v)) for k, v in s.items()}
                for i, s in enumerate(state)}
        shards.append({"state": {}, "param_groups": copy.deepcopy(groups), "base_state": base,
                       "shape_info": {i: p.shape for i, p in enumerate(params)},
                       "sharded_master_weights": {i: xla_chunk(p.detach().float(), dp, r) for i, p in enumerate(params)},
                       "dp_rank": r, "tp_rank": 0})
    return shards


def write_nxd_tag(root: str, tag: str, model_state: dict, shards: list[dict]) -> None:
    """NxD's ``save_checkpoint(use_xser=True)`` files (its ``_save``: xser reference file + tensors +
    ``.info.pt``); no ``done`` and no metadata.json, as NxD writes for an explicit tag."""
    from nxd_ckpt import xser

    name = "dp_rank_{:02d}_tp_rank_00_pp_rank_00.pt"
    for kind, items in (("model", [model_state]), ("optim", shards)):
        os.makedirs(os.path.join(root, tag, kind), exist_ok=True)
        for r, data in enumerate(items):
            path = os.path.join(root, tag, kind, name.format(r))
            xser.save(data, path, master_only=False)
            torch.save({}, path + ".info.pt")


def zero1(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    cfg = nxd.neuronx_distributed_config(optimizer_config={"zero_one_enabled": True, "grad_clipping": False})
    model = make_model(seed)
    return model, nxd.initialize_parallel_optimizer(cfg, torch.optim.AdamW, model.parameters(), lr=LR,
                                                    weight_decay=0.1)


def full_flat(shards: list[dict], key: str) -> torch.Tensor:
    shards = sorted(shards, key=lambda s: s["dp_rank"])
    return torch.cat([s["state"][0][key] for s in shards])[:shards[0]["groups"][0]["numel"]]


def load_nxd_tag_body(root: str, grads: list[torch.Tensor]) -> dict:
    model, opt = zero1(seed=1)  # other initial weights: the load must replace them
    nxd.load_checkpoint(root, tag="nxd_step3", model=model, optimizer=opt)
    out = {"shard": copy.deepcopy(opt.state_dict()), "model": {k: v.clone() for k, v in model.state_dict().items()}}
    for p, g in zip(model.parameters(), grads):  # the same gradient on every DP rank: its DP mean is exact
        p.grad = g.clone()
    opt.step()
    out["stepped"] = {k: v.clone() for k, v in model.state_dict().items()}
    return out


def test_nxd_written_zero1_xser_checkpoint_loads(rank_pool, tmp_path):
    model = make_model()
    plain = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.1)
    for step in range(STEPS):
        plain.zero_grad()
        loss_of(model, batch(step)).backward()
        plain.step()
    params = list(model.parameters())
    state = copy.deepcopy([plain.state[p] for p in params])  # the live state moves on with the next step
    # torch-xla's wrapper is a torch Optimizer built with NxD's keyword defaults only
    groups = [{"lr": LR, "weight_decay": 0.1, "params": list(range(len(params)))}]
    write_nxd_tag(str(tmp_path), "nxd_step3", model.state_dict(), nxd_rule_shards(params, state, groups, dp=2))

    plain.zero_grad()
    loss_of(model, batch(STEPS)).backward()
    grads = [p.grad.clone() for p in params]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    bound = AdamWStepBound(plain, grad_tol=0.0)  # same gradients: only the step's fp32 arithmetic differs
    bound.grads_ready()
    plain.step()
    names = dict(zip(params, dict(model.named_parameters())))
    step_bound = {names[p]: b for p, b in bound.stepped().items()}

    loaded = rank_pool(2).run(load_nxd_tag_body, str(tmp_path), grads)
    shards = [r["shard"] for r in loaded]
    for key in KEYS:
        want = torch.cat([s[key].reshape(-1) for s in state])
        assert torch.equal(full_flat(shards, key), want), key
    for s in shards:
        assert float(s["state"][0]["step"]) == STEPS
        assert s["param_groups"][0]["betas"] == (0.9, 0.999)  # the inner optimizer's own defaults kept
    for r in loaded:
        for k, v in before.items():
            assert torch.equal(r["model"][k], v), k
        # the next step continues from the loaded state: within two fp32 steps' arithmetic of AdamW's
        worst, name = within_bound(r["stepped"], dict(model.state_dict()), step_bound)
        assert worst <= 2.0, (name, worst)


def round_trip_body(root: str) -> dict:
    model, opt = zero1(seed=0)
    train_data_parallel(model, opt, map(batch, range(STEPS)), group=ps.get_data_parallel_group(), loss_of=loss_of)
    opt.save_sharded_state_dict(os.path.join(root, "xla"), layout="torch_xla")
    dist.barrier()
    out = {"shard": copy.deepcopy(opt.state_dict()), "params": [p.detach().clone() for p in model.parameters()]}
    out["back"] = reload_body(root)["shard"]
    _, fresh = zero1(seed=1)
    try:  # one DP rank's NxD shard cannot be loaded alone: it holds rows of every parameter
        fresh.load_state_dict(torch.load(os.path.join(root, "xla", "optim.dp_rank_00.tp_rank_00"), weights_only=True))
        out["refusal"] = "loaded"
    except ValueError as exc:
        out["refusal"] = str(exc)
    return out


def reload_body(root: str) -> dict:
    model, opt = zero1(seed=1)
    opt.load_sharded_state_dict(os.path.join(root, "xla"))
    return {"shard": copy.deepcopy(opt.state_dict())}


def test_nxd_layout_round_trip_is_exact(rank_pool, tmp_path):
    saved = rank_pool(2).run(round_trip_body, str(tmp_path))
    shards = [r["shard"] for r in saved]
    params = saved[0]["params"]
    files = [torch.load(tmp_path / "xla" / f"optim.dp_rank_{r:02d}.tp_rank_00", weights_only=True) for r in range(2)]
    # what nxd wrote is torch-xla's rule applied to nxd-zero1's own (gathered) state
    offsets = [0]
    for p in params:
        offsets.append(offsets[-1] + p.numel())
    state = [{k: full_flat(shards, k)[a:b].view(p.shape) for k in KEYS} for p, a, b in zip(params, offsets, offsets[1:])]
    for r, f in enumerate(files):
        assert f["dp_rank"] == r and f["state"] == {}
        assert [tuple(f["shape_info"][i]) for i in range(len(params))] == [tuple(p.shape) for p in params]
        for i, s in enumerate(state):
            for k in KEYS:
                assert torch.equal(f["base_state"][i][k], xla_chunk(s[k], 2, r)), (r, i, k)
            assert float(f["base_state"][i]["step"]) == STEPS
    for before, after in zip(shards, [r["back"] for r in saved]):  # DP=2 -> DP=2
        for key in KEYS:
            assert torch.equal(before["state"][0][key], after["state"][0][key])
    back = [r["shard"] for r in rank_pool(1).run(reload_body, str(tmp_path))]  # DP=2 -> DP=1
    for key in KEYS:
        assert torch.equal(full_flat(back, key), full_flat(shards, key)), key
    refusal = saved[0]["refusal"]
    assert "every DP rank's shard" in refusal and "load_state_dict_from_shards" in refusal
