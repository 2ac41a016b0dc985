"""NxD's optimizer state written at another TP than this run's, resharded onto this rank.

NxD writes one optimizer file per TP rank (``trainer/checkpoint.py`` ``save_checkpoint``: with
ZeRO-1 one per DP rank too, ``optim/dp_rank_DD_tp_rank_TT_pp_rank_PP.pt``, torch-xla's ZeRO-1
layout; without it ``optimizer.state_dict()`` of DP rank 0), or, with ``use_zero1_dcp``, one DCP
checkpoint keyed ``base_state.<parameter name>.<key>|tp-TTTT`` (:mod:`nxd_ckpt.nxd_dcp`). Each TP
rank's state is its parameters' state in optimizer order, every tensor shaped like that rank's
shard of the parameter. Adam's moments (and ZeRO-1's fp32 master weights) are elementwise in the
parameter, so each tensor reshards exactly as the parameter does (:mod:`nxd_ckpt.nxd_reshard`:
the saved sharding from the model's and the saved size; merged over the saved TP ranks and cut
for this one); scalars (``step``) are the same on every rank. The result is what this rank's
optimizer holds at the same TP: a DP=1 torch-xla shard for ZeRO-1 (nxd-zero1 loads it at any
DP size), torch's ``state_dict`` otherwise. Another PP size is refused (the stages' parameter
lists differ and NxD's files do not name them), as are K/V heads NxD tiled over TP.
"""

from __future__ import annotations

from typing import Any

import torch

from nxd_ckpt.errors import CheckpointError
from nxd_ckpt.layout import parse_shard_name
from nxd_ckpt.nxd_dcp import rank_entries, read_dcp, saved_name
from nxd_ckpt.nxd_layouts import nxd_written_degrees
from nxd_ckpt.nxd_reshard import kv_tensor_names, saved_sharding
from nxd_ckpt.sharding import global_shape, merge_shards, sharding_of, split_full
from nxd_core_parallel.xla_zero1_layout import MASTER_KEY, is_xla_state, merge_dp_shards

#: one saved TP rank's optimizer state: (param_groups, per-parameter state in optimizer order,
#: per-parameter master weights or None, whether it is ZeRO-1's)
RankState = tuple[list[dict], list[dict[str, Any]], list[torch.Tensor] | None, bool]


def _torch_rank_state(reader: Any, tp_rank: int, pp_rank: int, where: str) -> RankState:
    names = [n for n in reader.storage.list_files(f"{reader.tag}/optim")
             if (p := parse_shard_name(n)) and p[1:3] == (tp_rank, pp_rank)]
    if not names:
        raise CheckpointError(f"{where}: no optimizer file of tp_rank {tp_rank} pp_rank {pp_rank}")
    shards = [reader.load(f"optim/{n}") for n in sorted(names)]
    if is_xla_state(shards[0]):
        if any(k.startswith("ep_") for k in shards[0]):
            raise CheckpointError(f"{where}: NxD's ZeRO-1 state with expert parallelism (ep_*_offset keys) loads at "
                                  "the TP it was written at only")
        whole = merge_dp_shards(shards)
        order = [i for g in whole["param_groups"] for i in g["params"]]
        masters = whole.get(MASTER_KEY)
        return (whole["param_groups"], [whole["base_state"].get(i, {}) for i in order],
                [masters[i] for i in order] if masters else None, True)
    state = shards[0]
    order = [i for g in state["param_groups"] for i in g["params"]]
    return state["param_groups"], [state["state"].get(i, {}) for i in order], None, False


def _dcp_rank_states(reader: Any, saved_tp: int, pp_rank: int, names: list[str], where: str) -> list[RankState]:
    state = read_dcp(reader.storage, f"{reader.tag}/optim")
    groups = state.get("param_groups") or []
    out = []
    for r in range(saved_tp):
        entries = rank_entries(state.get("base_state", {}), r, pp_rank)
        keys = [saved_name(n, entries) for n in names]
        missing = [n for n, k in zip(names, keys) if k is None]
        if missing:
            raise CheckpointError(f"{where}: NxD's DCP optimizer state has no entry for parameter {missing[0]!r} at "
                                  f"tp_rank {r} pp_rank {pp_rank}")
        out.append((groups, [entries[k] for k in keys], None, True))  # type: ignore[index]
    return out


def _resharded(shards: list[torch.Tensor], param: torch.Tensor, name: str, kv: bool, tp: int, tp_rank: int,
               saved_tp: int, where: str) -> torch.Tensor:
    """This rank's piece of a tensor shaped like ``param`` from every saved TP rank's piece."""
    sh = sharding_of(param)
    if sh is None:  # replicated over TP: every saved rank holds it whole
        if list(shards[0].shape) != list(param.shape):
            raise CheckpointError(f"{where}: optimizer state of {name!r} is {list(shards[0].shape)}, the parameter "
                                  f"(not TP-sharded) is {list(param.shape)}")
        return shards[0]
    saved = saved_sharding(sh, param.shape[sh.dim], tp, shards[0].shape[sh.dim], saved_tp, name, kv)
    full = merge_shards(shards, saved)
    if list(full.shape) != global_shape(tuple(param.shape), sh, tp):
        raise CheckpointError(f"{where}: optimizer state of {name!r} at TP={saved_tp} assembles to {list(full.shape)}, "
                              f"the parameter's is {global_shape(tuple(param.shape), sh, tp)}")
    return split_full(full, sh, tp, tp_rank, name)


def nxd_optimizer_state_at(reader: Any, model: torch.nn.Module, optimizer: Any, tp: int, tp_rank: int,
                           pp: int, pp_rank: int, dcp: bool) -> tuple[dict, bool]:
    """``(state, zero1)``: this rank's optimizer state from an NxD-written tag saved at another TP:
    a DP=1 torch-xla ZeRO-1 shard when ``zero1``, else a torch ``state_dict``."""
    where = reader.storage.describe(f"{reader.tag}/optim")
    saved_tp, saved_pp = nxd_written_degrees(reader.storage, reader.tag)
    if saved_pp != pp:
        raise CheckpointError(f"{where}: optimizer state written by NxD at PP={saved_pp} does not reshard to this "
                              f"run's PP={pp} (each stage's parameter list differs; the model does reshard): pass "
                              f"optimizer=None to load the weights only, or load it at PP={saved_pp}")
    names_of = {id(p): n for n, p in model.named_parameters()}
    params = [(names_of.get(id(p), "?"), p) for g in optimizer.param_groups for p in g["params"]]
    ranks = _dcp_rank_states(reader, saved_tp, pp_rank, [n for n, _ in params], where) if dcp else \
        [_torch_rank_state(reader, r, pp_rank, where) for r in range(saved_tp)]
    groups, _, masters, zero1 = ranks[0]
    sizes = [len(g["params"]) for g in groups]
    if sizes != [len(g["params"]) for g in optimizer.param_groups]:
        raise CheckpointError(f"{where}: NxD's optimizer state has param groups of {sizes} parameters, the "
                              f"optimizer's are {[len(g['params']) for g in optimizer.param_groups]}")
    kv = kv_tensor_names(model)
    states: dict[int, dict] = {}
    for j, (name, param) in enumerate(params):
        saved = [r[1][j] for r in ranks]
        states[j] = {k: (_resharded([s[k] for s in saved], param, name, name in kv, tp, tp_rank, saved_tp, where)
                         if torch.is_tensor(v) and v.dim() > 0 else v) for k, v in saved[0].items()}
    ids = iter(range(len(params)))
    param_groups = [{**{k: v for k, v in g.items() if k != "params"}, "params": [next(ids) for _ in ng["params"]]}
                    for g, ng in zip(groups, optimizer.param_groups)]
    if not zero1:
        return {"state": {j: s for j, s in states.items() if s}, "param_groups": param_groups}, False
    out = {"state": {}, "param_groups": param_groups, "base_state": {j: s for j, s in states.items() if s},
           "shape_info": {j: p.shape for j, (_, p) in enumerate(params)}}
    if masters is not None:
        out[MASTER_KEY] = {j: _resharded([r[2][j] for r in ranks], p, n, n in kv, tp, tp_rank, saved_tp, where)
                           for j, (n, p) in enumerate(params)}
    return out, True
