"""Sharded checkpoints with NxD's API: async save, retention, auto-resume, S3 storage, resharding on load.

Use it through ``nxd.save_checkpoint`` / ``nxd.load_checkpoint`` / ``nxd.has_checkpoint`` /
``nxd.finalize_checkpoint``; this package registers the ``default`` checkpointer behind them.
"""

from nxd_ckpt.checkpointer import Checkpointer
from nxd_ckpt.consolidate import full_model_state
from nxd_ckpt.convert import (
    Converter,
    ConvertRequest,
    FullState,
    convert,
    run_convert,
)
from nxd_ckpt.errors import CheckpointError, CorruptCheckpointError
from nxd_ckpt.formats import CheckpointFormat, SafetensorsFormat, TorchFormat
from nxd_ckpt.layout import complete_tags, newest_complete_tag, shard_name
from nxd_ckpt.sharding import Sharding, merge_shards, sharding_of, split_full
from nxd_ckpt.storage import FsspecStorage, LocalStorage, Storage, open_storage

__version__ = "0.1.0"

__all__ = [
    "CheckpointError", "CheckpointFormat", "Checkpointer", "ConvertRequest", "Converter", "FullState", "convert",
    "full_model_state", "run_convert", "CorruptCheckpointError", "FsspecStorage",
    "LocalStorage", "SafetensorsFormat", "Sharding", "Storage", "TorchFormat", "complete_tags", "merge_shards",
    "newest_complete_tag", "open_storage", "shard_name", "sharding_of", "split_full",
]
