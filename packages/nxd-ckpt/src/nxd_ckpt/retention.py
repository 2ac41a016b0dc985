"""Deleting old checkpoints without ever making a half-deleted one look complete."""

from __future__ import annotations

import warnings

from nxd_ckpt.layout import DONE_MARKER, RETIRED_MARKER, list_tags, read_newest_pointer, write_newest_pointer
from nxd_ckpt.storage import Storage


def delete_checkpoint(storage: Storage, tag: str) -> None:
    """Mark the tag retired, then remove ``done``: if deletion stops half-way (a kill during
    retention) the rest is an incomplete leftover that auto-resume removes, not a whole checkpoint
    without ``done`` (which is kept and warned about as possibly the newest progress)."""
    with storage.open_write(f"{tag}/{RETIRED_MARKER}") as f:
        f.write(b"1")
    storage.remove_file(f"{tag}/{DONE_MARKER}")
    storage.remove_tree(tag)


def apply_retention(storage: Storage, num_kept: int, keep: str, own: frozenset[str] = frozenset()) -> list[str]:
    """Keep the newest ``num_kept`` complete checkpoints (and ``keep``); remove older complete ones
    and the incomplete leftovers of saves this process made (``own``): an incomplete checkpoint
    some other run left may be whole but unmarked, and only its owner decides (see verify.py).
    Returns the removed tags. Errors warn: the new checkpoint is safe."""
    infos = list_tags(storage)
    complete = [i for i in infos if i.complete]
    doomed = [i.location for i in complete[:-num_kept] if i.tag != keep] if num_kept > 0 else []
    doomed += [i.tag for i in infos if not i.complete and i.tag != keep and i.tag in own]
    removed = []
    pointed = read_newest_pointer(storage)
    for tag in doomed:
        if tag == pointed:  # never leave 'newest' naming a deleted tag (its update may have failed)
            write_newest_pointer(storage, complete[-1].tag if complete[-1].tag not in doomed else None)
        try:
            delete_checkpoint(storage, tag)
            removed.append(tag)
        except OSError as exc:
            warnings.warn(f"could not remove old checkpoint {storage.describe(tag)}: {exc}", stacklevel=2)
    return removed


def remove_incomplete(storage: Storage) -> list[str]:
    """Auto-resume's clean-up of saves that were interrupted while writing (partial: no complete
    metadata.json); whole checkpoints that only miss ``done`` are kept, with a warning."""
    from nxd_ckpt.verify import is_whole_unmarked, warn_unmarked

    warn_unmarked(storage)
    removed = []
    for info in list_tags(storage):
        # a tag with a 'done' that is not valid was committed once: kept (warned about), never deleted here
        if not info.complete and not is_whole_unmarked(storage, info.tag) \
                and not storage.exists(f"{info.tag}/{DONE_MARKER}"):
            try:
                storage.remove_tree(info.tag)
                removed.append(info.tag)
            except OSError as exc:
                warnings.warn(f"could not remove incomplete checkpoint {storage.describe(info.tag)}: {exc}", stacklevel=2)
    return removed
