"""Assemble the full (unsharded) model state of a checkpoint from its shards and metadata."""

from __future__ import annotations

import torch

from nxd_ckpt.errors import CheckpointError
from nxd_ckpt.layout import DONE_MARKER, checkpoint_dir, list_tags, newest_complete_tag, read_done, tag_inside
from nxd_ckpt.load import Reader, model_file
from nxd_ckpt.metadata import read_metadata
from nxd_ckpt.nxd_layouts import is_nxd_written
from nxd_ckpt.sharding import Sharding, merge_shards
from nxd_ckpt.storage import open_storage


def resolve_tag(path: str, tag: str | None, storage_options: dict | None = None) -> str:
    """The directory (under ``path``) of checkpoint ``tag``, default the newest complete one."""
    storage = open_storage(path, storage_options)
    if tag is None:
        tag = newest_complete_tag(storage)
        if tag is None:
            raise CheckpointError(f"{storage.describe('')}: no complete checkpoint")
    else:
        tag_inside(storage, tag, "--tag")
    where = checkpoint_dir(storage, tag)
    if where is None:
        tags = [i.tag for i in list_tags(storage)]
        if tag not in tags:
            raise CheckpointError(f"checkpoint tag {tag!r} not found under {storage.describe('')}; tags there: "
                                  f"{', '.join(tags) if tags else 'none'}")
        if is_nxd_written(storage, tag):  # NxD's converter writes no 'done': a named tag is read as written
            return tag
        raise CheckpointError(f"checkpoint {storage.describe(tag)} is incomplete (no 'done' marker)")
    return where


def full_model_state(path: str, tag: str | None = None, storage_options: dict | None = None) -> dict[str, torch.Tensor]:
    """``name -> full tensor`` for every model tensor of ``path/tag`` (needs our metadata.json)."""
    storage = open_storage(path, storage_options)
    tag = resolve_tag(path, tag, storage_options)
    done = read_done(storage, tag) if storage.exists(f"{tag}/{DONE_MARKER}") else {}
    meta = read_metadata(storage, tag, done.get("metadata"))
    if meta is None:
        raise CheckpointError(f"{storage.describe(tag)}: no metadata.json (a checkpoint written by NxD itself); "
                              "consolidating needs each tensor's sharding, which NxD does not record. A model "
                              "describes it: nxd.load_checkpoint(path, tag=..., model=...) loads it at any TP/PP, "
                              "then nxd.save_checkpoint writes a checkpoint this converts; or merge it with NxD's "
                              "checkpoint_converter --convert_to_full_state")
    reader = Reader(storage, tag, meta)
    out = {}
    for name, entry in meta["tensors"].items():
        pp, sh = int(entry["pp_rank"]), Sharding.from_json(entry["sharding"])
        if sh is None:
            out[name] = reader.load(*model_file(meta, reader, 0, pp))[name]
        else:
            shards = [reader.load(*model_file(meta, reader, r, pp))[name] for r in range(meta["degrees"]["tp"])]
            out[name] = merge_shards(shards, sh)
    return out
