"""NxD's ZeRO-1 optimizer state written with torch.distributed.checkpoint (DCP).

NxD's ``save_checkpoint(async_save=True, use_zero1_dcp=True)`` writes ``<tag>/optim/`` with
``optimizer/zero_dcp_utils.save_optim_state_dict``: DCP's ``.metadata`` and ``__R_0.distcp``
files holding its torch-xla ZeRO-1 state with every DP shard joined into one tensor per
parameter and state key, ``base_state.<parameter name>.<key>[|pp-PPPP][|tp-TTTT]`` (the suffixes
at PP / TP > 1), scalars (``step``) unsuffixed, ``param_groups`` and ``shape_info`` as objects.
It is read here with DCP itself (no process group) and handed to the optimizer as one DP=1
torch-xla shard of this TP/PP rank, the layout nxd-zero1 reads at any DP size.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from nxd_ckpt.errors import CheckpointError
from nxd_ckpt.storage import LocalStorage, Storage

DCP_METADATA = ".metadata"
_KEY = re.compile(r"^(?P<key>[^|]+)(?:\|pp-(?P<pp>\d+))?(?:\|tp-(?P<tp>\d+))?$")


def is_nxd_dcp_optim(storage: Storage, tag: str) -> bool:
    """``tag``'s optimizer state is NxD's DCP layout (``optim/.metadata``)."""
    return storage.exists(f"{tag}/optim/{DCP_METADATA}")


def read_dcp(storage: Storage, path: str) -> dict[str, Any]:
    """Everything in the DCP checkpoint at ``path``, nested as saved, tensors whole."""
    import io
    import warnings

    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    if not isinstance(storage, LocalStorage):
        raise CheckpointError(f"{storage.describe(path)}: NxD's DCP optimizer state is read from a local "
                              "directory only; copy the checkpoint to local storage first")
    buffer = io.BytesIO()
    with warnings.catch_warnings():  # DCP says it loads in one process: this rank reads the whole state on purpose
        warnings.simplefilter("ignore", UserWarning)
        dcp_to_torch_save(storage.describe(path), buffer)  # type: ignore[arg-type]
    buffer.seek(0)
    return torch.load(buffer, map_location="cpu", weights_only=True)


def _rank_entries(base_state: dict[str, dict], tp_rank: int, pp_rank: int) -> dict[str, dict[str, Any]]:
    """``parameter name -> {state key: tensor}`` of this TP/PP rank."""
    out: dict[str, dict[str, Any]] = {}
    for name, entry in base_state.items():
        for key, value in entry.items():
            m = _KEY.match(key)
            if m and (m["pp"] is None or int(m["pp"]) == pp_rank) and (m["tp"] is None or int(m["tp"]) == tp_rank):
                out.setdefault(name, {})[m["key"]] = value
    return out


def _saved_name(name: str, saved: dict[str, Any]) -> str | None:
    """``name`` as NxD saved it: itself, or the one saved name it ends (NxD's model wrapper prefixes)."""
    if name in saved:
        return name
    found = [s for s in saved if s.endswith("." + name)]
    return found[0] if len(found) == 1 else None


def nxd_dcp_xla_shard(state: dict[str, Any], groups: list[list[tuple[str, torch.Tensor]]], tp_rank: int,
                      pp_rank: int, where: str) -> dict[str, Any]:
    """This TP/PP rank's whole ZeRO-1 state as one DP=1 torch-xla shard for an optimizer whose
    param groups hold ``groups`` (``(name, parameter)`` in order), numbered in that order."""
    entries = _rank_entries(state.get("base_state", {}), tp_rank, pp_rank)
    saved_groups = state.get("param_groups") or []
    if len(saved_groups) != len(groups):
        raise CheckpointError(f"{where}: NxD's DCP optimizer state has {len(saved_groups)} param group(s), the "
                              f"optimizer {len(groups)}")
    base_state, shape_info, param_groups, used, index = {}, {}, [], set(), 0
    for saved, group in zip(saved_groups, groups):
        ids = []
        for name, param in group:
            key = _saved_name(name, entries)
            if key is None:
                raise CheckpointError(f"{where}: NxD's DCP optimizer state has no entry for parameter {name!r} at "
                                      f"tp_rank {tp_rank} pp_rank {pp_rank} (it holds {sorted(entries)[:6]}...)")
            used.add(key)
            base_state[index], shape_info[index] = entries[key], param.shape
            ids.append(index)
            index += 1
        param_groups.append({**{k: v for k, v in dict(saved).items() if k != "params"}, "params": ids})
    if set(entries) - used:
        raise CheckpointError(f"{where}: NxD's DCP optimizer state holds parameters the model does not have: "
                              f"{sorted(set(entries) - used)[:8]}")
    return {"state": {}, "param_groups": param_groups, "base_state": base_state, "shape_info": shape_info}
