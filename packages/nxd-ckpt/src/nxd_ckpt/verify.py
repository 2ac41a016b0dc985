"""Checkpoints that are whole but not marked complete, and verifying a checkpoint on demand.

A save writes ``done`` last; a directory with every file its ``metadata.json`` records but no
``done`` was interrupted at its very last step (or lost the marker). Nothing here trusts such a
checkpoint silently: auto-resume warns and skips it, retention never deletes it, and
``nxd ckpt verify --mark-done`` (or :func:`verify_checkpoint`) checks every file's checksum and
only then writes the marker, after which it resumes like any other.
"""

from __future__ import annotations

import json

from nxd_ckpt.checksum import digest_of, verify
from nxd_ckpt.errors import CheckpointError, CorruptCheckpointError
from nxd_ckpt.layout import (
    DONE_MARKER,
    METADATA,
    RETIRED_MARKER,
    done_payload,
    is_link,
    list_tags,
    read_done,
    tag_inside,
    warn_once,
)
from nxd_ckpt.storage import Storage, open_storage


def _metadata_bytes(storage: Storage, tag: str) -> bytes | None:
    if not storage.exists(f"{tag}/{METADATA}"):
        return None
    with storage.open_read(f"{tag}/{METADATA}") as f:
        return f.read()


def is_whole_unmarked(storage: Storage, tag: str) -> bool:
    """``tag`` has no ``done`` but a readable metadata.json whose recorded files all exist (and
    retention was not deleting it)."""
    retired = f"{tag}/{RETIRED_MARKER}"
    if storage.exists(f"{tag}/{DONE_MARKER}") or (storage.exists(retired) and not is_link(storage, retired)):
        return False
    try:
        data = _metadata_bytes(storage, tag)
        files = json.loads(data.decode()).get("files") if data is not None else None
    except (ValueError, UnicodeDecodeError, AttributeError):
        return False
    return isinstance(files, dict) and all(storage.exists(f"{tag}/{p}") for p in files)


def unmarked_checkpoints(storage: Storage) -> list[str]:
    return [i.tag for i in list_tags(storage) if not i.complete and is_whole_unmarked(storage, i.tag)]


def warn_unmarked(storage: Storage) -> list[str]:
    """Warn (loudly: these may be the newest progress) about whole checkpoints without ``done``."""
    tags = unmarked_checkpoints(storage)
    for tag in tags:
        warn_once(  # once per process: has_checkpoint and the load that follows both look
            f"checkpoint {storage.describe(tag)} has every file its metadata.json records but no 'done' marker: "
            "its save never committed (interrupted at the last step, or the marker was deleted). Auto-resume "
            "skips it and retention keeps it. To resume from it, verify it first: "
            f"`nxd ckpt verify {storage.describe('')} --tag {tag} --mark-done`")
    return tags


def verify_checkpoint(path: str, tag: str, mark_done: bool = False, storage_options: dict | None = None) -> int:
    """Check ``metadata.json`` and every file it records against their checksums; with
    ``mark_done`` write the ``done`` marker of a whole, unmarked checkpoint afterwards. Returns the
    number of files verified; raises :class:`CorruptCheckpointError` naming the first bad file."""
    storage = open_storage(path, storage_options)
    tag_inside(storage, tag, "--tag")
    if not storage.exists(tag):
        raise CheckpointError(f"checkpoint tag {tag!r} not found under {storage.describe('')}")
    data = _metadata_bytes(storage, tag)
    if data is None:
        raise CheckpointError(f"{storage.describe(f'{tag}/{METADATA}')}: missing; a checkpoint without it "
                              "(written by NxD itself, or damaged) has no checksums to verify")
    marked = storage.exists(f"{tag}/{DONE_MARKER}")
    recorded = read_done(storage, tag).get("metadata") if marked else None
    if recorded is not None:
        verify(data, recorded, storage.describe(f"{tag}/{METADATA}"))
    try:
        files = json.loads(data.decode())["files"]
    except (ValueError, UnicodeDecodeError, KeyError, TypeError) as exc:
        raise CorruptCheckpointError(f"{storage.describe(f'{tag}/{METADATA}')}: unreadable or saved without "
                                     f"checksums ({type(exc).__name__}: {exc})") from exc
    for rel, digest in files.items():
        where = storage.describe(f"{tag}/{rel}")
        if not storage.exists(f"{tag}/{rel}"):
            raise CheckpointError(f"{where}: missing (metadata.json records it)")
        with storage.open_read(f"{tag}/{rel}") as f:
            verify(f.read(), digest, where)
    if mark_done and not marked:
        with storage.open_write(f"{tag}/{DONE_MARKER}") as f:
            f.write(done_payload(digest_of(data)))
    return len(files)
