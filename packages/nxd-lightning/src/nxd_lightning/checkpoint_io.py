"""``NeuronCheckpointIO``: Lightning checkpoints stored as nxd sharded checkpoints.

Lightning names a checkpoint by a path (``<dirpath>/epoch=0-step=8.ckpt``); here that path is an
nxd checkpoint *tag directory* ``<dirpath>/<name>`` written by ``nxd.save_checkpoint`` (model and
optimizer shards per rank, ``done`` marker, async save and storage URLs as nxd-ckpt provides).
Lightning's own state (loops, callbacks, schedulers, data position, versions) is the checkpoint's
``user_content``. Loading restores the live model and optimizer in place and returns that state.
"""

from __future__ import annotations

import os
from typing import Any

from lightning.fabric.plugins import CheckpointIO

import nxd

#: Lightning keys whose content nxd writes as shards instead of inside user_content.
SHARDED_KEYS = ("state_dict", "optimizer_states")


def split_path(path: Any) -> tuple[str, str]:
    """``<dir>/<tag>`` -> (dir, tag); URLs such as ``s3://bucket/run/tag`` work too."""
    text = os.fspath(path).rstrip("/")
    head, _, tag = text.rpartition("/")
    if not head or not tag:
        raise ValueError(f"checkpoint path {text!r} must be <directory>/<name>")
    return head, tag


class NeuronCheckpointIO(CheckpointIO):
    """Saves and loads through ``nxd.save_checkpoint`` / ``nxd.load_checkpoint`` on every rank.

    ``save_load_xser=True`` stores tensors as safetensors (NxD's xser: one addressable record per
    tensor); ``async_save`` overlaps writing with training; ``num_kept_ckpts`` is left to
    Lightning's ``ModelCheckpoint(save_top_k=...)``.
    """

    LOADED_MARK = "_nxd_loaded"

    def __init__(self, save_load_xser: bool = True, weights_only: bool = False, async_save: bool = False) -> None:
        self.save_load_xser = save_load_xser
        self.weights_only = weights_only
        self.async_save = async_save

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        options = dict(storage_options or {})
        model, optimizer = options.pop("model", None), options.pop("optimizer", None)
        if model is None:
            raise ValueError("NeuronCheckpointIO.save_checkpoint needs the live model: use it through NxDStrategy")
        directory, tag = split_path(path)
        content = {k: v for k, v in checkpoint.items() if k not in SHARDED_KEYS}
        zero1 = bool(getattr(optimizer, "nxd_zero1", False))
        nxd.save_checkpoint(
            directory, tag, model=model, optimizer=None if self.weights_only else optimizer,
            user_content=content, use_xser=self.save_load_xser, async_save=self.async_save, zero1_optimizer=zero1,
            **options,
        )

    def load_checkpoint(self, path: Any, map_location: Any = None, weights_only: bool | None = None, *,
                        model: Any = None, optimizer: Any = None) -> dict[str, Any]:
        if model is None:
            raise ValueError("NeuronCheckpointIO.load_checkpoint needs the live model: use it through NxDStrategy")
        directory, tag = split_path(path)
        skip_optimizer = self.weights_only or bool(weights_only)
        content = nxd.load_checkpoint(directory, tag, model=model, optimizer=None if skip_optimizer else optimizer)
        if not isinstance(content, dict):
            raise ValueError(f"{path}: not a Lightning checkpoint (its user_content is {type(content).__name__}, "
                             "expected the Lightning state dict)")
        # Model and optimizer are restored already; placeholders keep Lightning's restore path happy.
        return {**content, "state_dict": {}, "optimizer_states": [{}] if optimizer is not None else [],
                self.LOADED_MARK: True}

    def remove_checkpoint(self, path: Any) -> None:
        from nxd_ckpt import open_storage

        directory, tag = split_path(path)
        storage = open_storage(directory)
        if storage.exists(f"{tag}/done"):
            storage.remove_file(f"{tag}/done")  # never a half-removed checkpoint that looks complete
        if storage.exists(tag):
            storage.remove_tree(tag)

    def teardown(self) -> None:
        nxd.finalize_checkpoint()
