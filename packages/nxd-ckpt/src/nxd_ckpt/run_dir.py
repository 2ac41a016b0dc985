"""What a training run records next to its checkpoints, and finding them from the run directory.

``nxd train`` writes its checkpoints to ``<run dir>/checkpoints/`` and puts a *model record* in
every checkpoint's ``user_content`` under :data:`MODEL_RECORD_KEY`: the registered model name, its
config as Hugging Face ``config.json`` keys, the tokenizer it trained with and, for LoRA runs, the
adapter's ``LoraConfig`` fields. ``nxd ckpt convert --from nxd --to hf RUN_DIR`` needs nothing else.
"""

from __future__ import annotations

import os
from typing import Any

#: the ``user_content`` key of the model record: ``{"name", "config", "tokenizer", "lora"}``
MODEL_RECORD_KEY = "nxd_model"
#: where ``nxd train`` puts checkpoints inside a run directory (exp_manager's default dirpath)
RUN_CHECKPOINTS = "checkpoints"


def model_record(name: str, config: dict[str, Any], tokenizer: str | None = None,
                 lora: dict[str, Any] | None = None) -> dict[str, Any]:
    """The record a trainer stores in ``user_content[MODEL_RECORD_KEY]`` (plain values only:
    ``user_content`` is loaded with ``weights_only=True``)."""
    return {"name": name, "config": dict(config),
            "tokenizer": os.path.abspath(tokenizer) if tokenizer and os.path.exists(tokenizer) else tokenizer,
            "lora": dict(lora) if lora else None}


def is_run_dir(path: str) -> bool:
    """A local directory holding ``checkpoints/`` and no checkpoint tags of its own."""
    if "://" in path or not os.path.isdir(os.path.join(path, RUN_CHECKPOINTS)):
        return False
    from nxd_ckpt.layout import list_tags
    from nxd_ckpt.storage import open_storage

    return not list_tags(open_storage(path))


def checkpoint_root(path: str) -> str:
    """``path`` itself, or ``path/checkpoints`` when ``path`` is an ``nxd train`` run directory."""
    return os.path.join(path, RUN_CHECKPOINTS) if is_run_dir(path) else path


def checkpoint_record(path: str, tag: str) -> dict[str, Any]:
    """The model record of checkpoint ``path/tag`` (``{}`` when it has none: written by NxD, or a
    plain ``save_checkpoint``)."""
    from nxd_ckpt.convert import read_user_content

    content = read_user_content(path, tag)
    record = content.get(MODEL_RECORD_KEY) if isinstance(content, dict) else None
    return record if isinstance(record, dict) else {}


def checkpoint_has_adapters(path: str, tag: str) -> bool:
    """Whether checkpoint ``path/tag`` is a LoRA run's (base under ``module.``, adapters beside it),
    as its model record says: such a checkpoint loads into the whole LoRA model, not its base."""
    return bool(checkpoint_record(path, tag).get("lora"))
