"""NxD's own ZeRO-1 optimizer state (torch-xla's ``ZeroRedundancyOptimizer`` layout), read and written.

NxD's ``NeuronZero1Optimizer`` subclasses torch-xla's ``ZeroRedundancyOptimizer``
(``torch_xla/distributed/zero_redundancy_optimizer.py``); its ``state_dict()`` per DP rank is

* ``param_groups``: torch's (hyper-parameters; ``params`` numbered over all groups), ``state``: ``{}``;
* ``base_state``: ``{i: inner optimizer state of parameter i's shard}``: every tensor shaped like
  the shard is parameter ``i`` zero-padded along dimension 0 to a multiple of the DP size and
  chunked (DP rank ``r`` holds rows ``[r*c, (r+1)*c)``); scalars (``step``) as they are;
* ``shape_info``: ``{i: torch.Size}``; ``sharded_master_weights``: ``{i: fp32 chunk}`` with
  ``save_master_weights``. NxD's ``save_sharded_state_dict`` adds ``dp_rank``/``tp_rank``.

nxd-zero1 shards a group's flat buffer instead, so neither layout's DP shard is a slice of the
other's: reading converts every DP rank's NxD shard into one DP=1 nxd-zero1 shard (the whole
state of this TP/PP rank, on every DP rank) that the resharding loader cuts; writing gathers the
state over DP first. Expert-parallel groups (NxD writes them with ``ep_*_offset`` keys) are refused.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from nxd_zero1.checkpoint import FORMAT_KEY, FORMAT_VERSION, build_state_dict
from nxd_zero1.groups import group_rank

if TYPE_CHECKING:
    from nxd_zero1.optimizer import NeuronZero1Optimizer

#: keys torch-xla's ZeroRedundancyOptimizer.state_dict() adds to torch's
XLA_KEYS = ("base_state", "shape_info")


def is_xla_state(sd: Any) -> bool:
    """``sd`` is a DP shard in NxD's (torch-xla's) ZeRO-1 layout."""
    return isinstance(sd, dict) and all(k in sd for k in XLA_KEYS)


def _chunk(full: torch.Tensor, dp_size: int, dp_rank: int) -> torch.Tensor:
    """torch-xla's ``_shard_tensor``: pad dimension 0 to a multiple of ``dp_size``, keep chunk ``dp_rank``."""
    if full.size(0) % dp_size:
        full = F.pad(full, [0, 0] * (full.dim() - 1) + [0, dp_size - full.size(0) % dp_size])
    return full.chunk(dp_size)[dp_rank].clone()


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


def xla_state_dict(opt: NeuronZero1Optimizer) -> dict:
    """This DP rank's state in NxD's layout (collective over the DP group: every rank calls it)."""
    _check_unpartitioned(opt)
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
                base_state[index] = {k: (_chunk(full[k][pi], opt.dp_size, opt.dp_rank) if k in full
                                         else (v.clone() if torch.is_tensor(v) else v)) for k, v in entry.items()}
            if master is not None:
                masters[index] = _chunk(master[pi], opt.dp_size, opt.dp_rank)
            index += 1
        param_groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": ids})
    out: dict[str, Any] = {"state": {}, "param_groups": param_groups, "base_state": base_state,
                           "shape_info": shape_info, "dp_rank": opt.dp_rank,
                           "tp_rank": group_rank(opt.grad_norm_group)}
    if masters:
        out["sharded_master_weights"] = masters
    return out


def _ordered(shards: list[dict]) -> list[dict]:
    """The DP shards by ``dp_rank`` (NxD's save_sharded_state_dict records it; otherwise as given)."""
    if all("dp_rank" in s for s in shards):
        shards = sorted(shards, key=lambda s: int(s["dp_rank"]))
        ranks = [int(s["dp_rank"]) for s in shards]
        if ranks != list(range(len(shards))):
            raise ValueError(f"NxD ZeRO-1 shards of DP ranks {ranks} given; every DP rank's shard (0..{len(shards) - 1}) "
                             "is needed: each holds rows of every parameter")
    return shards


def _full_param(shards: list[dict], key: str, i: int, rows: int, what: str) -> torch.Tensor:
    chunks = []
    for r, s in enumerate(shards):
        table = s[key] if key == "sharded_master_weights" else s["base_state"].get(i, {})
        tensor = table.get(i) if key == "sharded_master_weights" else table.get(what)
        if tensor is None:
            raise ValueError(f"NxD ZeRO-1 shard of DP rank {r} has no {what!r} for parameter {i}")
        chunks.append(tensor)
    return torch.cat(chunks)[:rows]


def nxd_shard_from_xla(opt: NeuronZero1Optimizer, shards: list[dict]) -> dict:
    """Every DP rank's NxD shard (any DP size) as one DP=1 nxd-zero1 shard for ``opt``'s groups."""
    _check_unpartitioned(opt)
    if any(k.startswith("ep_") for k in shards[0]):
        raise ValueError("this NxD ZeRO-1 state was saved with expert parallelism (ep_*_offset keys); "
                         "nxd-zero1 reads NxD's ZeRO-1 layout without expert parallelism only")
    shards = _ordered(shards)
    first = shards[0]
    saved_groups = first["param_groups"]
    if len(saved_groups) != len(opt._layouts):
        raise ValueError(f"NxD ZeRO-1 state has {len(saved_groups)} param groups, the optimizer has {len(opt._layouts)}")
    groups, state, sharded_keys, masters = [], {}, {}, []
    has_master = all("sharded_master_weights" in s for s in shards)
    for gi, (saved, layout) in enumerate(zip(saved_groups, opt._layouts)):
        ids = list(saved["params"])
        shapes = [tuple(first["shape_info"][i]) for i in ids]
        if shapes != [tuple(s) for s in layout.shapes]:
            raise ValueError(f"param group {gi}: NxD ZeRO-1 state holds parameters of shapes {shapes}, the "
                             f"optimizer's are {[list(s) for s in layout.shapes]}; the model does not match")
        entry0 = first["base_state"].get(ids[0], {}) if ids else {}
        keys = [k for k, v in entry0.items() if torch.is_tensor(v) and v.dim() > 0]
        if entry0:
            entry = {k: torch.cat([_full_param(shards, "base_state", i, s[0], k).reshape(-1)
                                   for i, s in zip(ids, shapes)]) for k in keys}
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
            masters.append(torch.cat([_full_param(shards, "sharded_master_weights", i, s[0], "master weight")
                                      .reshape(-1) for i, s in zip(ids, shapes)]))
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
