"""NxD's own ZeRO-1 optimizer state (torch-xla's ``ZeroRedundancyOptimizer`` layout), read and written.

The layout's rules (``base_state``/``shape_info``/``sharded_master_weights``, dimension 0 padded to
a multiple of the DP size and chunked) are :mod:`nxd_core_parallel.xla_zero1_layout`'s.
nxd-zero1 shards a group's flat buffer instead, so neither layout's DP shard is a slice of the
other's: reading joins every DP rank's NxD shard into one DP=1 nxd-zero1 shard (the whole
state of this TP/PP rank, on every DP rank) that the resharding loader cuts; writing gathers the
state over DP first. Expert-parallel groups (NxD writes them with ``ep_*_offset`` keys) are refused.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from nxd_core_parallel.xla_zero1_layout import MASTER_KEY, is_xla_state, merge_dp_shards, xla_chunk
from nxd_zero1.checkpoint import FORMAT_KEY, FORMAT_VERSION, build_state_dict
from nxd_zero1.groups import group_rank

if TYPE_CHECKING:
    from nxd_zero1.optimizer import NeuronZero1Optimizer

__all__ = ["is_xla_state", "nxd_shard_from_xla", "xla_state_dict"]


def _check_unpartitioned(opt: NeuronZero1Optimizer) -> None:
    for gi, comm in enumerate(opt._comms):
        if comm.partition_size > 1:
            raise ValueError(f"param group {gi} is partitioned over {comm.partition_size} ranks (expert parallel); "
                             "NxD's ZeRO-1 layout is read and written for groups without expert parallelism only")
    if any(len(s) == 0 for layout in opt._layouts for s in layout.shapes):
        raise ValueError("a 0-dimensional parameter has no dimension 0 to chunk in NxD's ZeRO-1 layout")


def _gather_flat(opt: NeuronZero1Optimizer, gi: int, shard: torch.Tensor) -> torch.Tensor:
    """Group ``gi``'s full flat tensor (padding dropped) from every DP rank's ``shard`` (collective)."""
    if opt.dp_size > 1:
        parts = [torch.empty_like(shard) for _ in range(opt.dp_size)]
        dist.all_gather(parts, shard.contiguous(), group=opt.sharding_group)
        shard = torch.cat(parts)
    return shard[:opt._layouts[gi].numel]


def _per_param(opt: NeuronZero1Optimizer, gi: int, flat: torch.Tensor) -> list[torch.Tensor]:
    layout = opt._layouts[gi]
    return [flat[off:off + int(torch.Size(shape).numel())].view(shape)
            for off, shape in zip(layout.offsets, layout.shapes)]


def xla_state_dict(opt: NeuronZero1Optimizer, whole: bool = False) -> dict:
    """This DP rank's state in NxD's layout (collective over the DP group: every rank calls it).
    ``whole=True``: every tensor whole over DP, as a DP=1 run holds it (NxD's DCP layout joins the
    DP shards so)."""
    _check_unpartitioned(opt)
    dp_size, dp_rank = (1, 0) if whole else (opt.dp_size, opt.dp_rank)
    sd = build_state_dict(opt)
    base_state: dict[int, dict] = {}
    shape_info: dict[int, torch.Size] = {}
    masters: dict[int, torch.Tensor] = {}
    param_groups, index = [], 0
    for gi, group in enumerate(opt.param_groups):
        entry = sd["state"].get(gi, {})
        full = {k: _per_param(opt, gi, _gather_flat(opt, gi, entry[k])) for k in sd["sharded_keys"].get(gi, [])}
        master = _per_param(opt, gi, _gather_flat(opt, gi, sd["master_weights"][gi])) \
            if "master_weights" in sd else None
        ids = []
        for pi, shape in enumerate(opt._layouts[gi].shapes):
            ids.append(index)
            shape_info[index] = torch.Size(shape)
            if entry:
                base_state[index] = {k: (xla_chunk(full[k][pi], dp_size, dp_rank) if k in full
                                         else (v.clone() if torch.is_tensor(v) else v)) for k, v in entry.items()}
            if master is not None:
                masters[index] = xla_chunk(master[pi], dp_size, dp_rank)
            index += 1
        param_groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": ids})
    out: dict[str, Any] = {"state": {}, "param_groups": param_groups, "base_state": base_state,
                           "shape_info": shape_info, "dp_rank": dp_rank,
                           "tp_rank": group_rank(opt.grad_norm_group)}
    if masters:
        out[MASTER_KEY] = masters
    return out


def _whole(merged: dict, i: int, key: str) -> torch.Tensor:
    """Parameter ``i``'s whole ``key`` tensor (a state key, or its master weight) of a DP-joined shard."""
    tensor = merged[MASTER_KEY].get(i) if key == MASTER_KEY else merged["base_state"].get(i, {}).get(key)
    if tensor is None:
        raise ValueError(f"NxD ZeRO-1 state has no {'master weight' if key == MASTER_KEY else repr(key)} for "
                         f"parameter {i}")
    return tensor


def nxd_shard_from_xla(opt: NeuronZero1Optimizer, shards: list[dict]) -> dict:
    """Every DP rank's NxD shard (any DP size) as one DP=1 nxd-zero1 shard for ``opt``'s groups."""
    _check_unpartitioned(opt)
    if any(k.startswith("ep_") for k in shards[0]):
        raise ValueError("this NxD ZeRO-1 state was saved with expert parallelism (ep_*_offset keys); "
                         "nxd-zero1 reads NxD's ZeRO-1 layout without expert parallelism only")
    first = merge_dp_shards(shards)
    saved_groups = first["param_groups"]
    if len(saved_groups) != len(opt._layouts):
        raise ValueError(f"NxD ZeRO-1 state has {len(saved_groups)} param groups, the optimizer has {len(opt._layouts)}")
    groups, state, sharded_keys, masters = [], {}, {}, []
    has_master = MASTER_KEY in first
    for gi, (saved, layout) in enumerate(zip(saved_groups, opt._layouts)):
        ids = list(saved["params"])
        shapes = [tuple(first["shape_info"][i]) for i in ids]
        if shapes != [tuple(s) for s in layout.shapes]:
            raise ValueError(f"param group {gi}: NxD ZeRO-1 state holds parameters of shapes {shapes}, the "
                             f"optimizer's are {[list(s) for s in layout.shapes]}; the model does not match")
        entry0 = first["base_state"].get(ids[0], {}) if ids else {}
        keys = [k for k, v in entry0.items() if torch.is_tensor(v) and v.dim() > 0]
        if entry0:
            entry = {k: torch.cat([_whole(first, i, k).reshape(-1) for i in ids]) for k in keys}
            for k, v in entry0.items():
                if k in keys:
                    continue
                others = {str(first["base_state"][i][k]) for i in ids}
                if len(others) != 1:
                    raise ValueError(f"param group {gi}: NxD ZeRO-1 state has different {k!r} per parameter "
                                     f"({sorted(others)}); nxd-zero1 steps a group as one")
                entry[k] = v
            state[gi] = entry
            sharded_keys[gi] = keys
        if has_master:
            masters.append(torch.cat([_whole(first, i, MASTER_KEY).reshape(-1) for i in ids]))
        groups.append({"numel": layout.numel, "padded_numel": layout.numel, "shard_start": 0,
                       "shard_end": layout.numel, "shapes": [list(s) for s in shapes], "partition_size": 1,
                       "partition_rank": 0})
    out = {FORMAT_KEY: FORMAT_VERSION, "dp_rank": 0, "dp_size": 1, "groups": groups, "state": state,
           "sharded_keys": sharded_keys, "rng_state": opt.generator.get_state(),
           # torch-xla's wrapper records only the keywords NxD passed: the inner optimizer's other
           # hyper-parameters (betas, eps, ...) keep their values
           "param_groups": [{**{k: v for k, v in inner.items() if k != "params"},
                             **{k: v for k, v in g.items() if k != "params"}, "params": [gi]}
                            for gi, (g, inner) in enumerate(zip(saved_groups, opt.optim.param_groups))]}
    if has_master:
        out["master_weights"] = masters
    return out
