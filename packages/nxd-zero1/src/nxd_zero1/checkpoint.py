"""ZeRO-1 optimizer state dicts: one self-describing shard per DP rank, resharded on load.

A shard records the DP size and rank it was saved at and, per param group, the group's unpadded
``numel`` and the global flat range ``[shard_start, shard_end)`` it holds. Loading at any DP size
reassembles each rank's new range from the overlapping pieces of the saved shards, so no rank ever
materialises a full unsharded state. A param group whose parameters are slices of larger ones (a
``partition_group``, e.g. experts split over expert-parallel ranks) also records its partition size
and rank; its pieces are placed in the flat layout of the full parameters, so it reshards across
the partition size as well.
"""

from __future__ import annotations

import glob
import os
import re
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from nxd_zero1.groups import group_rank
from nxd_zero1.layout import gather_range, global_runs

if TYPE_CHECKING:
    from nxd_zero1.optimizer import NeuronZero1Optimizer

FORMAT_KEY = "nxd_zero1_format"
FORMAT_VERSION = 1


def build_state_dict(opt: NeuronZero1Optimizer) -> dict:
    inner = opt.optim.state_dict()
    state, sharded = {}, {}
    for idx, entry in inner["state"].items():
        shape = opt._shards[idx].shape
        state[idx] = dict(entry)
        sharded[idx] = [k for k, v in entry.items() if torch.is_tensor(v) and v.dim() == 1 and v.shape == shape]
    groups = []
    for layout, params, comm in zip(opt._layouts, opt._flat_params, opt._comms):
        groups.append({**layout.describe(), "dtype": str(params[0].dtype) if params else "none",
                       "partition_size": comm.partition_size, "partition_rank": comm.partition_rank})
    sd: dict[str, Any] = {
        FORMAT_KEY: FORMAT_VERSION,
        "dp_rank": opt.dp_rank,
        "dp_size": opt.dp_size,
        "groups": groups,
        "param_groups": [{**{k: v for k, v in g.items() if k != "params"}, "params": [i]}
                         for i, g in enumerate(opt.param_groups)],
        "state": state,
        "sharded_keys": sharded,
        "rng_state": opt.generator.get_state(),
    }
    if opt.save_master_weights:
        sd["master_weights"] = [s.detach().clone() for s in opt._shards]
    return sd


def _check_shard(i: int, sd: Any) -> None:
    if not isinstance(sd, dict) or FORMAT_KEY not in sd:
        raise ValueError(f"shard {i} is not a ZeRO-1 optimizer state dict (no {FORMAT_KEY!r} key, nor NxD's "
                         "base_state/shape_info); it must come from NeuronZero1Optimizer.state_dict()")
    if sd[FORMAT_KEY] != FORMAT_VERSION:
        raise ValueError(f"shard {i} has ZeRO-1 format {sd[FORMAT_KEY]}, this nxd-zero1 reads {FORMAT_VERSION}")


def _partition(group: dict) -> tuple[int, int]:
    return int(group.get("partition_size", 1)), int(group.get("partition_rank", 0))


def _full_shapes(group: dict) -> list[list[int]]:
    """The saved group's parameter shapes before partitioning (dimension 0 times the partition size)."""
    size = _partition(group)[0]
    return [[s[0] * size, *s[1:]] if s else s for s in group["shapes"]]


def check_same_layout(opt: NeuronZero1Optimizer, sd: dict) -> None:
    _check_shard(0, sd)
    if (sd["dp_size"], sd["dp_rank"]) != (opt.dp_size, opt.dp_rank):
        raise ValueError(
            f"load_state_dict got the shard of DP rank {sd['dp_rank']} of {sd['dp_size']}, but this is DP rank "
            f"{opt.dp_rank} of {opt.dp_size}; use load_state_dict_from_shards(all_shards) to load across DP sizes"
        )
    for gi, (group, comm) in enumerate(zip(sd["groups"], opt._comms)):
        if _partition(group) != (comm.partition_size, comm.partition_rank):
            raise ValueError(
                f"param group {gi} was saved as partition {_partition(group)[1]} of {_partition(group)[0]}, this rank "
                f"holds partition {comm.partition_rank} of {comm.partition_size} (e.g. another expert-parallel "
                "size); use load_state_dict_from_shards(all_shards) to reshard")


def _global_pieces(sd: dict, gi: int, tensor: torch.Tensor) -> list[tuple[int, int, torch.Tensor]]:
    """``tensor`` (the saved flat shard of group ``gi``) as pieces placed in the full-parameter layout."""
    group = sd["groups"][gi]
    start = group["shard_start"]
    size, rank = _partition(group)
    return [(g, g + n, tensor[lo - start:lo - start + n])
            for lo, g, n in global_runs(group["shapes"], size, rank, start, group["shard_end"])]


def _assemble(opt: NeuronZero1Optimizer, gi: int, pieces: list[tuple[int, int, torch.Tensor]],
              like: torch.Tensor) -> torch.Tensor:
    """This rank's flat shard of group ``gi`` (padding zero) from full-layout ``pieces``."""
    layout, comm = opt._layouts[gi], opt._comms[gi]
    out = torch.zeros(layout.shard_size, dtype=like.dtype, device=like.device)
    total = layout.numel * comm.partition_size
    for lo, g, n in global_runs(layout.shapes, comm.partition_size, comm.partition_rank, layout.shard_start,
                                layout.shard_end):
        local = lo - layout.shard_start
        out[local:local + n].copy_(gather_range(pieces, g, g + n, total, like=like))
    return out


def load_from_shards(opt: NeuronZero1Optimizer, shards: list[dict], allow_partial: bool = False) -> None:
    from nxd_zero1.xla_layout import is_xla_state, nxd_shard_from_xla

    if not shards:
        raise ValueError("load_state_dict_from_shards got no shards")
    if any(is_xla_state(sd) for sd in shards):  # NxD's own (torch-xla) layout: every DP rank's shard
        if not all(is_xla_state(sd) for sd in shards):
            raise ValueError("shards mix NxD's torch-xla ZeRO-1 layout and nxd-zero1's; pass the shards of one save")
        shards, allow_partial = [nxd_shard_from_xla(opt, shards)], False
    for i, sd in enumerate(shards):
        _check_shard(i, sd)
    shards = sorted(shards, key=lambda sd: sd["dp_rank"])
    if not allow_partial:
        sizes = {sd["dp_size"] for sd in shards}
        if len(sizes) != 1:
            raise ValueError(f"shards come from different DP sizes {sorted(sizes)}; pass the shards of one save")
        (size,) = sizes
        missing = sorted(set(range(size)) - {sd["dp_rank"] for sd in shards})
        if missing or len(shards) != size:
            raise ValueError(f"shards were saved at DP size {size} but DP ranks {missing or 'duplicated'} "
                             f"are missing; got ranks {[sd['dp_rank'] for sd in shards]}")
    if len(shards[0]["groups"]) != len(opt._layouts):
        raise ValueError(f"checkpoint has {len(shards[0]['groups'])} param groups, optimizer has {len(opt._layouts)}")

    new_state: dict[int, dict] = {}
    for gi, (layout, comm) in enumerate(zip(opt._layouts, opt._comms)):
        saved_numel = shards[0]["groups"][gi]["numel"] * _partition(shards[0]["groups"][gi])[0]
        if saved_numel != layout.numel * comm.partition_size:
            raise ValueError(f"param group {gi}: checkpoint holds {saved_numel} elements, the optimizer's parameters "
                             f"have {layout.numel * comm.partition_size}; the model does not match the checkpoint")
        saved = _full_shapes(shards[0]["groups"][gi])
        ours = [[s[0] * comm.partition_size, *s[1:]] if s else list(s) for s in layout.shapes]
        if saved != ours:
            raise ValueError(f"param group {gi}: checkpoint holds parameters of shapes {saved}, the optimizer's are "
                             f"{ours}; the model does not match the checkpoint")
        holders = [sd for sd in shards if gi in sd["state"]]
        if not holders:
            continue
        entry = {}
        for key, value in holders[0]["state"][gi].items():
            if key in holders[0]["sharded_keys"][gi]:
                pieces = [piece for sd in holders for piece in _global_pieces(sd, gi, sd["state"][gi][key])]
                entry[key] = _assemble(opt, gi, pieces, like=value)
            else:
                entry[key] = value
        new_state[gi] = entry

    saved_groups = shards[0]["param_groups"]
    opt.optim.load_state_dict({"state": new_state, "param_groups": [
        {**{k: v for k, v in g.items() if k != "params"}, "params": [gi]} for gi, g in enumerate(saved_groups)]})
    for outer, saved in zip(opt.param_groups, saved_groups):
        outer.update({k: v for k, v in saved.items() if k != "params"})

    if all("master_weights" in sd for sd in shards):
        for gi in range(len(opt._layouts)):
            pieces = [piece for sd in shards for piece in _global_pieces(sd, gi, sd["master_weights"][gi])]
            opt._shards[gi].copy_(_assemble(opt, gi, pieces, like=opt._shards[gi]))
    else:
        opt.reload_master_weights_from_params()
    for sd in shards:
        if (sd["dp_size"], sd["dp_rank"]) == (opt.dp_size, opt.dp_rank):
            opt.generator.set_state(sd["rng_state"])


def shard_filename(opt: NeuronZero1Optimizer, dp_rank: int | str | None = None) -> str:
    """NxD's file name for a DP shard, ``optim.dp_rank_DD.tp_rank_TT`` (its
    ``zero_redundancy_optimizer.py``); at PP > 1 nxd appends ``.pp_rank_PP`` (NxD's name has no
    pipeline rank, so its stages would overwrite each other's files)."""
    dp = "*" if dp_rank == "*" else f"{opt.dp_rank if dp_rank is None else dp_rank:02d}"
    name = f"optim.dp_rank_{dp}.tp_rank_{group_rank(opt.grad_norm_group):02d}"
    pipeline = opt.pipeline_group
    if pipeline is not None and dist.is_initialized() and dist.get_world_size(pipeline) > 1:
        name += f".pp_rank_{group_rank(pipeline):02d}"
    return name


def _older_filename(opt: NeuronZero1Optimizer) -> str:
    """The name nxd-zero1 wrote before it followed NxD's (still read)."""
    return f"dp_rank_*_tp_rank_{group_rank(opt.grad_norm_group):02d}_pp_rank_{group_rank(opt.pipeline_group):02d}.pt"


#: ``save_sharded``'s layouts: nxd-zero1's self-describing shards, or NxD's own (torch-xla's)
LAYOUTS = ("zero1", "torch_xla")


def save_sharded(opt: NeuronZero1Optimizer, output_dir: str, save_serially: bool = True,
                 layout: str = "zero1") -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, shard_filename(opt))
    if layout == "torch_xla":
        from nxd_zero1.xla_layout import xla_state_dict

        sd = xla_state_dict(opt)  # collective: every DP rank gathers before any writes
    else:
        sd = opt.state_dict()
        sd["tp_rank"] = group_rank(opt.grad_norm_group)  # NxD records both ranks in the shard
    for turn in range(opt.dp_size if save_serially else 1):
        if not save_serially or turn == opt.dp_rank:
            tmp = f"{path}.tmp{os.getpid()}"
            torch.save(sd, tmp)
            os.replace(tmp, path)  # a reader never sees a half-written shard
        if opt.dp_size > 1:
            dist.barrier(group=opt.sharding_group)


def load_sharded(opt: NeuronZero1Optimizer, output_dir: str) -> None:
    """Every DP shard of this TP/PP rank (NxD's names, else nxd-zero1's older ones), resharded
    to the current DP size."""
    paths: list[str] = []
    for pattern in (shard_filename(opt, "*"), _older_filename(opt)):
        paths = sorted(p for p in glob.glob(os.path.join(output_dir, pattern))
                       if re.search(r"dp_rank_\d+[._]", os.path.basename(p)) and ".tmp" not in p)
        if paths:
            break
    if not paths:
        raise FileNotFoundError(f"no ZeRO-1 optimizer shards matching {os.path.join(output_dir, shard_filename(opt, '*'))!r}")
    shards = [torch.load(p, map_location="cpu", weights_only=True, mmap=True) for p in paths]
    load_from_shards(opt, shards)
