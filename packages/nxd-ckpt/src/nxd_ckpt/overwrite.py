"""Saving over an existing tag without ever losing what was written.

A save over a complete tag is written to ``.saving-<tag>`` and committed there (its ``done``
marker); only then is the old version deleted (``done`` first) and the new one moved into place.
At every moment one complete copy exists: the old tag, the committed temporary, or the new tag.
``recover`` finishes or discards what a crash left behind: a complete temporary replaces its tag,
an incomplete one is removed. Storages with a ``rename`` (the local disk: an atomic directory
rename) move in one step; others copy file by file with ``done`` last, then delete the source
``done`` first, so a half-moved directory never looks complete.
"""

from __future__ import annotations

from nxd_ckpt.layout import DONE_MARKER, TEMP_PREFIX, temp_dir
from nxd_ckpt.retention import delete_checkpoint
from nxd_ckpt.storage import Storage


def prepare_target(storage: Storage, tag: str) -> str:
    """Where a new save of ``tag`` writes (rank 0, before the other ranks start writing)."""
    recover(storage, tag)
    if storage.exists(f"{tag}/{DONE_MARKER}"):
        return temp_dir(tag)
    if storage.exists(tag):
        storage.remove_tree(tag)  # an interrupted save's leftover: nothing complete is lost
    return tag


def swap_in(storage: Storage, tag: str, temp: str) -> None:
    """Replace the complete ``tag`` with the committed ``temp``."""
    delete_checkpoint(storage, tag)
    move_tree(storage, temp, tag)


def recover(storage: Storage, tag: str) -> None:
    """Finish (complete temporary) or discard (incomplete one) an interrupted overwrite of ``tag``."""
    temp = temp_dir(tag)
    if not storage.exists(temp):
        return
    if not storage.exists(f"{temp}/{DONE_MARKER}"):
        storage.remove_tree(temp)
        return
    if storage.exists(tag):
        delete_checkpoint(storage, tag)
    move_tree(storage, temp, tag)


def recover_all(storage: Storage) -> None:
    for name in storage.list_dirs(""):
        if name.startswith(TEMP_PREFIX):
            recover(storage, name[len(TEMP_PREFIX):])


def _files(storage: Storage, root: str) -> list[str]:
    out = [f"{root}/{name}" for name in storage.list_files(root)]
    for sub in storage.list_dirs(root):
        out += _files(storage, f"{root}/{sub}")
    return out


def move_tree(storage: Storage, src: str, dst: str) -> None:
    """Move the checkpoint directory ``src`` to ``dst`` (which must not exist)."""
    rename = getattr(storage, "rename", None)
    if callable(rename):
        rename(src, dst)
        return
    done = f"{src}/{DONE_MARKER}"
    files = [f for f in _files(storage, src) if f != done]
    copy = getattr(storage, "copy_file", None)
    for path in [*files, done]:  # 'done' last: the copy is complete only once everything is there
        target = dst + path[len(src):]
        if callable(copy):
            copy(path, target)
        else:
            with storage.open_read(path) as r, storage.open_write(target) as w:
                while chunk := r.read(1 << 24):
                    w.write(chunk)
    delete_checkpoint(storage, src)
