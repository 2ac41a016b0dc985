"""A run's state in ``torch.distributed.checkpoint`` (DCP) format, and back.

Layout (torchtitan's): the model's tensors at the top level under their names, the optimizer's
state under ``"optimizer"`` (``get_state_dict``'s flattened names), written sharded: each rank
writes its own DTensor shards, DCP's ``.metadata`` describes the global tensors, so any DCP reader
(torchtitan, one process with no process group, another FSDP degree) can load it. ``key_map``
renames model keys on the way out (``load_dcp`` takes the inverse), for another code base's names.

The save goes to ``<path>.partial`` and is renamed to ``path`` by rank 0 after every rank
finished (DCP writes ``.metadata`` last), so ``path`` exists only complete. Every file's CRC-32,
computed while it is written, goes into ``nxd_checksums.json``; a load checks them before DCP
reads a byte (``nxd_core_parallel.dcp_integrity``). Model state is DCP's
global view only where the parameters are FSDP's DTensors over the whole model: tensor and
pipeline parallelism (whose parameters are TP-local plain tensors) are refused."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from nxd import ParallelContext
from nxd_core_parallel.dcp_integrity import (
    DigestingWriter,
    SafeReader,
    load_error,
    record_manifest,
    save_error,
    verify_dcp,
)
from nxd_core_parallel.dcp_metadata import quiet_metadata_fallback
from nxd_fsdp.shard import sharded_state_dict

OPTIMIZER_KEY = "optimizer"
_OPTIONS = StateDictOptions(full_state_dict=False)


def _module(model: Any) -> Any:
    return model.local_module() if callable(getattr(model, "local_module", None)) else model


def _inner(optimizer: Any) -> Any:
    return getattr(optimizer, "optimizer", optimizer)


def _check(context: ParallelContext | None) -> None:
    if context is not None and (context.tp.size > 1 or context.pp.size > 1):
        raise ValueError(f"DCP export needs TP=1 and PP=1 (got TP={context.tp.size}, PP={context.pp.size}): nxd's "
                         "TP/PP parameters are per-rank tensors, not DTensors DCP can describe globally; save with "
                         "nxd.save_checkpoint and convert (nxd ckpt convert --to full) instead")


def _state(module: Any, optimizer: Any, key_map: Callable[[str], str] | None) -> dict[str, Any]:
    with sharded_state_dict(module):
        model_state = get_model_state_dict(module, options=_OPTIONS)
        state = {(key_map(k) if key_map else k): v for k, v in model_state.items()}
        if optimizer is not None:
            state[OPTIMIZER_KEY] = get_optimizer_state_dict(module, _inner(optimizer), options=_OPTIONS)
    return state


def save_dcp(path: str, model: Any, optimizer: Any = None, *, context: ParallelContext | None = None,
             key_map: Callable[[str], str] | None = None) -> None:
    """Write ``model`` (and ``optimizer``) to the DCP checkpoint directory ``path``; collective."""
    _check(context)
    if os.path.exists(path):
        raise FileExistsError(f"{path} exists; DCP checkpoints are written once (choose a new path)")
    partial = path + ".partial"
    writer = DigestingWriter(partial)
    try:
        dcp.save(_state(_module(model), optimizer, key_map), storage_writer=writer)
    except (CheckpointException, OSError) as exc:
        raise save_error(path, exc) from None
    record_manifest(partial, writer, "nxd_fsdp.save_dcp")
    if dist.get_rank() == 0:
        os.replace(partial, path)
    dist.barrier()


def load_dcp(path: str, model: Any, optimizer: Any = None, *, context: ParallelContext | None = None,
             key_map: Callable[[str], str] | None = None) -> None:
    """Read the DCP checkpoint ``path`` into ``model`` (and ``optimizer``), resharding to this run's
    layout; ``key_map`` maps this model's names to the checkpoint's. Collective."""
    _check(context)
    files = verify_dcp(path)  # nxd's checksums (None: a folder torchtitan or torch wrote, noted)
    module = _module(model)
    state = _state(module, optimizer, key_map)
    try:  # each rank checks every file as it reads it; DCP's own logging of a bad .metadata is dropped
        with quiet_metadata_fallback():
            dcp.load(state, storage_reader=SafeReader(path, files))
    except (CheckpointException, AssertionError, OSError, RuntimeError, ValueError) as exc:
        raise load_error(path, exc) from None
    with sharded_state_dict(module):
        names = {(key_map(k) if key_map else k): k for k in get_model_state_dict(module, options=_OPTIONS)}
        model_state = {names[k]: v for k, v in state.items() if k != OPTIMIZER_KEY}
        set_model_state_dict(module, model_state, options=_OPTIONS)
        if optimizer is not None:
            set_optimizer_state_dict(module, _inner(optimizer), state[OPTIMIZER_KEY], options=_OPTIONS)

