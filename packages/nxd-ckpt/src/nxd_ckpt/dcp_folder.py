"""A ``torch.distributed.checkpoint`` (DCP) folder read and written in one process, no process group.

DCP's ``.metadata`` is a pickle; an untrusted one could run code when unpickled, so it is read
with nxd's one restricted unpickler (``nxd_core_parallel.dcp_metadata``: DCP's metadata classes and
torch's dtype/layout/size values only; :class:`SafeFileSystemReader`). Tensors come from the ``.distcp`` files through DCP itself
(``torch.load(weights_only=True)``). Non-tensor entries (``BytesStorageMetadata``: pickled
objects such as a data loader's state) are never read, only named.

Layout read and written (torchtitan's and ``nxd_fsdp.dcp``'s): model tensors at the top level under
their names; a training run's other states under their own prefixes (``optimizer``,
``lr_scheduler``, ``train_state``, ``dataloader``)."""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import StorageMeta, TensorStorageMetadata

from nxd_ckpt.errors import CheckpointError
from nxd_core_parallel.dcp_metadata import DcpMetadataError, load_dcp_metadata, quiet_metadata_fallback


class SafeFileSystemReader(FileSystemReader):
    """DCP's file reader, its ``.metadata`` unpickled with only DCP's own classes allowed."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        path = os.path.join(str(self.path), ".metadata")
        with open(path, "rb") as f:
            data = f.read()
        try:
            metadata = load_dcp_metadata(data, path)
        except DcpMetadataError as exc:
            raise CheckpointError(str(exc)) from None
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def is_dcp_folder(path: str) -> bool:
    return os.path.isfile(os.path.join(path, ".metadata"))


def _check_folder(path: str) -> None:
    if not is_dcp_folder(path):
        what = "does not exist" if not os.path.exists(path) else "has no .metadata (not a complete DCP checkpoint)"
        raise CheckpointError(f"{path} {what}")


def dcp_entries(path: str) -> dict[str, Any]:
    """Every entry's storage metadata in the DCP folder ``path`` (flattened keys: ``optimizer.state...``)."""
    _check_folder(path)
    return dict(SafeFileSystemReader(path).read_metadata().state_dict_metadata)


def read_dcp_tensors(path: str, keys: list[str] | None = None) -> dict[str, torch.Tensor]:
    """The tensors ``keys`` (default: every tensor entry) of the DCP folder ``path``, whole, on CPU."""
    entries = dcp_entries(path)
    keys = [k for k, m in entries.items() if isinstance(m, TensorStorageMetadata)] if keys is None else keys
    state: dict[str, torch.Tensor] = {}
    for key in keys:
        meta = entries.get(key)
        if not isinstance(meta, TensorStorageMetadata):
            raise CheckpointError(f"{path}: no tensor {key!r} in the DCP checkpoint")
        state[key] = torch.empty(tuple(meta.size), dtype=meta.properties.dtype)
    with quiet_metadata_fallback():
        dcp.load(state, storage_reader=SafeFileSystemReader(path), no_dist=True)
    return state


#: the state groups a training checkpoint keeps beside its model tensors (torchtitan's names)
TRAINING_STATE_GROUPS = ("optimizer", "lr_scheduler", "train_state", "dataloader")


def read_dcp_model(path: str) -> tuple[dict[str, torch.Tensor], set[str]]:
    """The model tensors of the DCP folder ``path`` (top-level keys outside :data:`TRAINING_STATE_GROUPS`)
    and the names of the training-state groups it also holds."""
    entries = dcp_entries(path)
    groups = {key.split(".", 1)[0] for key in entries} & set(TRAINING_STATE_GROUPS)
    model = [k for k, m in entries.items()
             if k.split(".", 1)[0] not in TRAINING_STATE_GROUPS and isinstance(m, TensorStorageMetadata)]
    if not model:
        raise CheckpointError(f"{path}: the DCP checkpoint holds no model tensors at its top level")
    return read_dcp_tensors(path, model), groups


def write_dcp_folder(path: str, state: dict[str, torch.Tensor], files: dict[str, bytes] | None = None) -> None:
    """Write ``state`` (whole tensors) as the DCP folder ``path`` in one process, with ``files``
    (name -> content) beside it; ``path`` exists only complete (written to ``<path>.partial``, then
    renamed)."""
    if os.path.exists(path):
        raise CheckpointError(f"{path} exists; write a DCP checkpoint to a new folder")
    partial = path + ".partial"
    if os.path.exists(partial):
        raise CheckpointError(f"{partial} exists (an interrupted write?); remove it first")
    state = {k: v.detach().contiguous() for k, v in state.items()}
    dcp.save(state, storage_writer=dcp.FileSystemWriter(partial), no_dist=True)
    for name, content in (files or {}).items():
        with open(os.path.join(partial, name), "wb") as f:
            f.write(content)
    os.replace(partial, path)
