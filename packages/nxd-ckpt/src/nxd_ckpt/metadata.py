"""``metadata.json``: what a checkpoint holds, enough to reshard it and to inspect it."""

from __future__ import annotations

import functools
import json
from typing import Any

import torch

from nxd_ckpt.checksum import digest_of, verify
from nxd_ckpt.layout import METADATA
from nxd_ckpt.sharding import Sharding, global_shape, sharding_of
from nxd_ckpt.storage import Storage
from nxd_ckpt.topology import Topology

FORMAT_VERSION = 1


def tensor_entries(state: dict[str, Any], shardings: dict[str, Sharding | None], topo: Topology) -> dict[str, dict]:
    """This rank's contribution: each tensor's global shape, dtype, sharding and PP stage."""
    out = {}
    for name, t in state.items():
        if not isinstance(t, torch.Tensor):
            continue
        sh = shardings.get(name)
        out[name] = {
            "shape": global_shape(tuple(t.shape), sh, topo.tp),
            "dtype": str(t.dtype).removeprefix("torch."),
            "sharding": sh.to_json() if sh else None,
            "pp_rank": topo.pp_rank,
        }
    return out


def shardings_of(module: Any, state: dict[str, Any] | None = None) -> dict[str, Sharding | None]:
    """Sharding of every parameter of ``module`` under its parameter names, and under the names of
    ``state`` (``module``'s state dict, which every rank built) where they differ; buffers are
    replicated. The names differ when ``module`` holds a wrapper whose ``state_dict`` drops its own
    prefix (an NxDModel inside a LightningModule, which NxD's fine-tuning example saves): matched by
    the storage a state entry shares with a parameter, so such a save records its shards as sharded.
    ``state`` is passed in, never built here: a state dict may be collective (expert-parallel
    modules gather their experts), and only the ranks that write a replica ask for shardings."""
    if not hasattr(module, "named_parameters"):
        return {}
    params = dict(module.named_parameters(remove_duplicate=False))
    out = {name: sharding_of(p) for name, p in params.items()}
    if state:
        by_storage = {_storage_key(p): sharding for p, sharding in zip(params.values(), out.values(), strict=True)}
        by_storage.pop(None, None)
        for name, t in state.items():
            key = _storage_key(t) if name not in out else None
            if key in by_storage:
                out[name] = by_storage[key]
    return out


def _storage_key(t: Any) -> tuple | None:
    """Where a plain tensor's data lives and its shape (a state dict's entries are detached
    parameters: new tensor objects on the parameters' storage); ``None`` for anything else."""
    if type(t) not in (torch.Tensor, torch.nn.Parameter) or t.is_meta or t.data_ptr() == 0:
        return None
    return (t.data_ptr(), tuple(t.shape), t.dtype)


def library_versions() -> dict[str, str]:
    return dict(_library_versions())


@functools.cache
def _library_versions() -> dict[str, str]:  # importlib.metadata reads files: ~2 ms a package, once is enough
    from importlib.metadata import PackageNotFoundError, version

    out = {"torch": torch.__version__}
    for dist in ("nxd", "nxd-ckpt", "nxd-core-parallel"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            pass
    return out


def build_metadata(tag: str, topo: Topology, fmt: str, tensors: dict[str, dict], **flags: Any) -> dict[str, Any]:
    return {
        "format_version": FORMAT_VERSION,
        "tag": tag,
        "degrees": topo.degrees(),
        "model_format": fmt,
        "versions": library_versions(),
        **flags,
        "tensors": dict(sorted(tensors.items())),
    }


def write_metadata(storage: Storage, tag: str, meta: dict[str, Any]) -> dict[str, Any]:
    """Write ``metadata.json``; returns its digest (recorded in ``done``)."""
    data = json.dumps(meta, indent=1).encode()
    with storage.open_write(f"{tag}/{METADATA}") as f:
        f.write(data)
    return digest_of(data)


def read_metadata(storage: Storage, tag: str, recorded: dict | None = None) -> dict[str, Any] | None:
    """The metadata, or None for checkpoints written by NxD itself (no metadata file).
    ``recorded``: the digest ``done`` holds for it (checkpoints since checksums were added)."""
    from nxd_ckpt.errors import CheckpointError, CorruptCheckpointError

    where = storage.describe(f"{tag}/{METADATA}")
    if not storage.exists(f"{tag}/{METADATA}"):
        if recorded is not None:
            raise CheckpointError(f"{where}: missing, but the checkpoint's 'done' marker says it was written; "
                                  "without it the checkpoint cannot be verified or its RNG states restored")
        return None
    with storage.open_read(f"{tag}/{METADATA}") as f:
        data = f.read()
    if recorded is not None:
        verify(data, recorded, where)
    try:
        meta = json.loads(data.decode())
    except (ValueError, UnicodeDecodeError) as exc:
        raise CorruptCheckpointError(f"{where}: corrupted metadata ({exc})") from exc
    if not isinstance(meta, dict) or not isinstance(meta.get("degrees"), dict):
        raise CorruptCheckpointError(f"{where}: not nxd-ckpt metadata (no 'degrees')")
    return meta
