"""NxD's ZeRO-1 optimizer state written with torch.distributed.checkpoint (DCP).

NxD's ``save_checkpoint(async_save=True, use_zero1_dcp=True)`` writes ``<tag>/optim/`` with
``optimizer/zero_dcp_utils.save_optim_state_dict``: DCP's ``.metadata`` and ``__R_0.distcp``
files holding its torch-xla ZeRO-1 state with every DP shard joined into one tensor per
parameter and state key, ``base_state.<parameter name>.<key>[|pp-PPPP][|tp-TTTT]`` (the suffixes
at PP / TP > 1), scalars (``step``) unsuffixed, ``param_groups`` and ``shape_info`` as objects.
It is read here with DCP itself (no process group) and handed to the optimizer as one DP=1
torch-xla shard of this TP/PP rank, the layout nxd-zero1 reads at any DP size.

``save_checkpoint(use_zero1_dcp=True)`` writes the same layout: every rank hands DCP its TP/PP
rank's state whole over DP, keyed as NxD's ``_wrap_optim_state_dict`` keys it; DCP writes each
tensor once (the DP ranks' copies are one replicated tensor to its planner) and rank 0 writes
``.metadata``. NxD's ``load_optim_state_dict`` reads it with its own DP chunks (DCP reads any
chunk of a saved tensor).
"""

from __future__ import annotations

import functools
import re
from typing import Any

import torch

from nxd.errors import NxdError
from nxd_ckpt.errors import CheckpointError
from nxd_ckpt.storage import LocalStorage, Storage
from nxd_core_parallel.xla_zero1_layout import MASTER_KEY

DCP_METADATA = ".metadata"
_KEY = re.compile(r"^(?P<key>[^|]+)(?:\|pp-(?P<pp>\d+))?(?:\|tp-(?P<tp>\d+))?$")


def is_nxd_dcp_optim(storage: Storage, tag: str) -> bool:
    """``tag``'s optimizer state is NxD's DCP layout (``optim/.metadata``)."""
    return storage.exists(f"{tag}/optim/{DCP_METADATA}")


def read_dcp(storage: Storage, path: str) -> dict[str, Any]:
    """Everything in the DCP checkpoint at ``path``, nested as saved, tensors whole. ``.metadata``
    goes through nxd's restricted unpickler and non-tensor entries through
    ``torch.load(weights_only=True)``: a crafted file is refused naming it, never run."""
    import warnings

    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    from nxd_ckpt.dcp_folder import SafeFileSystemReader
    from nxd_core_parallel.dcp_metadata import quiet_metadata_fallback

    local = _local_dir(storage, path)
    reader = SafeFileSystemReader(local)
    reader.read_metadata()  # a damaged or crafted .metadata is refused here, naming it (DCP would wrap it)
    state: dict[str, Any] = {}
    with warnings.catch_warnings(), quiet_metadata_fallback():  # DCP's one-process note: this rank reads all on purpose
        warnings.simplefilter("ignore", UserWarning)
        try:
            _load_state_dict(state, storage_reader=reader, planner=_safe_planner_class()(storage.describe(path)),
                             no_dist=True)
        except BaseException as exc:  # noqa: BLE001 - DCP's CheckpointException is a BaseException; never its advice
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            cause = _first_cause(exc)
            if isinstance(cause, NxdError):  # nxd's own finding names the file
                raise CheckpointError(str(cause)) from None
            raise CheckpointError(f"{storage.describe(path)}: DCP could not read it ({type(cause).__name__}); its "
                                  ".metadata or .distcp files are damaged (truncated, swapped or altered): restore "
                                  "the checkpoint") from None
    return state


def _first_cause(exc: BaseException) -> BaseException:
    """The lowest rank's exception inside DCP's ``CheckpointException`` (``exc`` itself otherwise)."""
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict) and failures:
        found = failures[min(failures)]
        return found[0] if isinstance(found, tuple) else found
    return exc


@functools.cache
def _safe_planner_class() -> type:
    from torch.distributed.checkpoint._traverse import set_element
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner

    class SafeEmptyPlanner(_EmptyStateDictLoadPlanner):
        """DCP's planner that rebuilds the saved state, its non-tensor entries read with
        ``torch.load(weights_only=True)`` (DCP's own planner uses ``weights_only=False``)."""

        def __init__(self, where: str) -> None:
            super().__init__()
            self.where = where

        def load_bytes(self, read_item: Any, value: Any) -> None:
            fqn = read_item.dest_index.fqn
            try:
                obj = torch.load(value, weights_only=True)
            except Exception as exc:  # noqa: BLE001 - a crafted or damaged entry: named, never run
                raise CheckpointError(f"{self.where}: entry {fqn!r} is not plain data ({type(exc).__name__}); "
                                      "refusing to unpickle it (the checkpoint is damaged or was crafted)") from None
            if self.flatten_state_dict:
                set_element(self.original_state_dict, self.mappings[fqn], obj)
            else:
                self.state_dict[fqn] = obj

    return SafeEmptyPlanner


def rank_entries(base_state: dict[str, dict], tp_rank: int, pp_rank: int) -> dict[str, dict[str, Any]]:
    """``parameter name -> {state key: tensor}`` of this TP/PP rank."""
    out: dict[str, dict[str, Any]] = {}
    for name, entry in base_state.items():
        for key, value in entry.items():
            m = _KEY.match(key)
            if m and (m["pp"] is None or int(m["pp"]) == pp_rank) and (m["tp"] is None or int(m["tp"]) == tp_rank):
                out.setdefault(name, {})[m["key"]] = value
    return out


def saved_name(name: str, saved: dict[str, Any]) -> str | None:
    """``name`` as NxD saved it: itself, or the one saved name it ends (NxD's model wrapper prefixes)."""
    if name in saved:
        return name
    found = [s for s in saved if s.endswith("." + name)]
    return found[0] if len(found) == 1 else None


def nxd_dcp_xla_shard(state: dict[str, Any], groups: list[list[tuple[str, torch.Tensor]]], tp_rank: int,
                      pp_rank: int, where: str) -> dict[str, Any]:
    """This TP/PP rank's whole ZeRO-1 state as one DP=1 torch-xla shard for an optimizer whose
    param groups hold ``groups`` (``(name, parameter)`` in order), numbered in that order."""
    entries = rank_entries(state.get("base_state", {}), tp_rank, pp_rank)
    saved_groups = state.get("param_groups") or []
    if len(saved_groups) != len(groups):
        raise CheckpointError(f"{where}: NxD's DCP optimizer state has {len(saved_groups)} param group(s), the "
                              f"optimizer {len(groups)}")
    base_state, shape_info, param_groups, used, index = {}, {}, [], set(), 0
    for saved, group in zip(saved_groups, groups):
        ids = []
        for name, param in group:
            key = saved_name(name, entries)
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


def _local_dir(storage: Storage, path: str) -> str:
    if not isinstance(storage, LocalStorage):
        raise CheckpointError(f"{storage.describe(path)}: NxD's DCP optimizer state is read and written in a local "
                              "directory only (use_zero1_dcp=True: save to a local path)")
    return storage.describe(path)


def nxd_dcp_state(xla: dict[str, Any], names: list[str], tp: int, tp_rank: int, pp: int, pp_rank: int,
                  where: str) -> dict[str, Any]:
    """A TP/PP rank's ZeRO-1 state (a torch-xla shard whole over DP, parameters numbered over the
    optimizer's groups, ``names`` in that order) keyed as NxD's ``_wrap_optim_state_dict`` keys it."""
    if MASTER_KEY in xla:  # NxD's DCP writer keys every tensor by a parameter name: master weights have none
        raise CheckpointError(f"{where}: use_zero1_dcp=True with ZeRO-1 master weights in the checkpoint "
                              "(use_master_weights_in_ckpt): NxD's DCP optimizer layout has no place for them; save "
                              "without use_zero1_dcp, or without master weights")
    suffix = (f"|pp-{pp_rank:04d}" if pp > 1 else "") + (f"|tp-{tp_rank:04d}" if tp > 1 else "")
    base = {names[i]: {(k + suffix if torch.is_tensor(v) and v.dim() > 0 else k): v for k, v in entry.items()}
            for i, entry in xla["base_state"].items()}
    return {**{k: v for k, v in xla.items() if k not in ("base_state", "dp_rank", "tp_rank")}, "base_state": base}


def write_dcp(storage: Storage, path: str, state: dict[str, Any], group: Any) -> list[str]:
    """Save ``state`` with DCP at ``path`` (collective over ``group``: every rank calls it; ``None``:
    one process); returns the files in ``path`` afterwards (complete on rank 0)."""
    import os

    import torch.distributed.checkpoint as dcp

    local = _local_dir(storage, path)
    os.makedirs(local, exist_ok=True)
    dcp.save(state, storage_writer=dcp.FileSystemWriter(local), process_group=group, no_dist=group is None)
    return sorted(os.listdir(local))
