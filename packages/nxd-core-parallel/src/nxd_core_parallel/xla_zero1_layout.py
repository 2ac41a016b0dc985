"""torch-xla's ZeRO-1 state layout (NxD's ``NeuronZero1Optimizer``), the rules both its writer
(nxd-zero1) and the checkpoint reader (nxd-ckpt) follow.

``ZeroRedundancyOptimizer.state_dict()`` per DP rank (``torch_xla/distributed/zero_redundancy_optimizer.py``):
``param_groups`` (torch's, ``params`` numbered over all groups), ``state`` ``{}``, ``base_state``
``{i: inner optimizer state of parameter i's shard}``, ``shape_info`` ``{i: torch.Size}`` and, with
``save_master_weights``, ``sharded_master_weights`` ``{i: fp32 chunk}``. A shard of a tensor shaped
like parameter ``i`` is that tensor zero-padded along dimension 0 to a multiple of the DP size and
chunked (``_pad_to_world_size`` + ``_shard_tensor``: DP rank ``r`` holds rows ``[r*c, (r+1)*c)``);
scalars (``step``) are whole on every rank. NxD's ``save_sharded_state_dict`` adds ``dp_rank`` and
``tp_rank``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

#: keys torch-xla's ZeroRedundancyOptimizer.state_dict() adds to torch's
XLA_KEYS = ("base_state", "shape_info")
MASTER_KEY = "sharded_master_weights"


def is_xla_state(sd: Any) -> bool:
    """``sd`` is a DP shard in torch-xla's (NxD's) ZeRO-1 layout."""
    return isinstance(sd, dict) and all(k in sd for k in XLA_KEYS)


def xla_chunk(full: torch.Tensor, dp_size: int, dp_rank: int) -> torch.Tensor:
    """torch-xla's ``_shard_tensor``: pad dimension 0 to a multiple of ``dp_size``, keep chunk ``dp_rank``."""
    if full.size(0) % dp_size:
        full = F.pad(full, [0, 0] * (full.dim() - 1) + [0, dp_size - full.size(0) % dp_size])
    return full.chunk(dp_size)[dp_rank].clone()


def _ordered(shards: list[dict]) -> list[dict]:
    """The DP shards by ``dp_rank`` (NxD's save_sharded_state_dict records it; otherwise as given)."""
    if all("dp_rank" in s for s in shards):
        shards = sorted(shards, key=lambda s: int(s["dp_rank"]))
        ranks = [int(s["dp_rank"]) for s in shards]
        if ranks != list(range(len(shards))):
            raise ValueError(f"NxD ZeRO-1 shards of DP ranks {ranks} given; every DP rank's shard (0..{len(shards) - 1}) "
                             "is needed: each holds rows of every parameter")
    return shards


def _joined(chunks: list[Any], rows: int, what: str, i: int) -> torch.Tensor:
    for r, c in enumerate(chunks):
        if c is None:
            raise ValueError(f"NxD ZeRO-1 shard of DP rank {r} has no {what!r} for parameter {i}")
    return torch.cat(chunks)[:rows]


def merge_dp_shards(shards: list[dict]) -> dict:
    """Every DP rank's shard joined into the one a DP=1 run writes (tensors whole, padding dropped)."""
    shards = _ordered(shards)
    first = shards[0]
    base_state: dict[int, dict] = {}
    for i, entry in first["base_state"].items():
        rows = int(first["shape_info"][i][0]) if len(first["shape_info"][i]) else 0
        base_state[i] = {k: (_joined([s["base_state"].get(i, {}).get(k) for s in shards], rows, k, i)
                             if torch.is_tensor(v) and v.dim() > 0 else v) for k, v in entry.items()}
    out = {k: v for k, v in first.items() if k not in ("base_state", MASTER_KEY, "dp_rank")}
    out.update(base_state=base_state, dp_rank=0)
    if all(MASTER_KEY in s for s in shards):
        out[MASTER_KEY] = {i: _joined([s[MASTER_KEY].get(i) for s in shards], int(first["shape_info"][i][0]),
                                      "master weight", i) for i in first[MASTER_KEY]}
    return out
