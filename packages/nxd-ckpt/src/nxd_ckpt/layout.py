"""Where things live inside a checkpoint directory (NxD's layout, plus our metadata and RNG files).

```
<root>/<tag>/checkpoint                         marker written first (NxD)
<root>/<tag>/model/dp_rank_00_tp_rank_TT_pp_rank_PP.pt
<root>/<tag>/optim/dp_rank_DD_tp_rank_TT_pp_rank_PP.pt
<root>/<tag>/scheduler.pt, user_content.pt
<root>/<tag>/rng/rank_RRRRR.pt                  per-rank RNG states (ours)
<root>/<tag>/metadata.json                      degrees, tensor shapes and sharding, versions (ours)
<root>/<tag>/done                               written last: the checkpoint is complete
<root>/newest                                   text: the newest complete tag (older NxD)
<root>/.saving-<tag>/                           a save over an existing tag, until it is swapped in
```
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass

from nxd.paths import check_name, name_problem
from nxd_ckpt.storage import Storage

CHECKPOINT_MARKER = "checkpoint"
DONE_MARKER = "done"
#: written by retention before it removes ``done``: a deletion that stops half-way leaves a leftover,
#: never a "whole but unmarked" checkpoint that asks to be verified and is kept forever
RETIRED_MARKER = "retired"
NEWEST_POINTER = "newest"
METADATA = "metadata.json"
#: a save over an existing complete tag is written here and swapped in after its ``done`` marker;
#: tags never start with '.', so no tag can collide with it
TEMP_PREFIX = ".saving-"


def temp_dir(tag: str) -> str:
    return f"{TEMP_PREFIX}{tag}"


def shard_name(dp_rank: int, tp_rank: int, pp_rank: int, suffix: str = ".pt") -> str:
    return f"dp_rank_{dp_rank:02d}_tp_rank_{tp_rank:02d}_pp_rank_{pp_rank:02d}{suffix}"


_SHARD_RE = re.compile(r"^dp_rank_(\d+)(?:_ep_rank_(\d+))?_tp_rank_(\d+)_pp_rank_(\d+)(\.\w+)$")


def parse_shard_name(name: str) -> tuple[int, int, int, str] | None:
    """``(dp, tp, pp, suffix)`` of a shard file name, or None for other files."""
    m = _SHARD_RE.match(name)
    return (int(m[1]), int(m[3]), int(m[4]), m[5]) if m else None


def shard_ep_rank(name: str) -> int | None:
    """The EP rank in an NxD shard file name (``dp_rank_00_ep_rank_EE_...``: NxD writes one model
    file per expert-parallel rank, holding that rank's experts), or None when it has none."""
    m = _SHARD_RE.match(name)
    return int(m[2]) if m and m[2] is not None else None


def rng_name(rank: int) -> str:
    return f"rng/rank_{rank:05d}.pt"


def validate_tag(tag: str, key: str = "checkpoint tag") -> str:
    """``tag`` as one folder name under the checkpoint root (``nxd.paths``), or raise naming ``key``."""
    return check_name(tag, key)


def is_link(storage: Storage, path: str) -> bool:
    """``path`` is a symbolic link (only local storages have them)."""
    probe = getattr(storage, "is_link", None)
    return bool(probe and probe(path))


def link_note(storage: Storage, path: str) -> str:
    target = getattr(storage, "link_target", None)
    return f"{storage.describe(path)} is a symbolic link" + (f" (to {target(path)})" if target else "")


def tag_inside(storage: Storage, tag: str, key: str = "checkpoint tag") -> str:
    """A tag named by a caller (``--tag``, ``load_checkpoint(tag=...)``): one folder name under the
    root that is not a symbolic link out of it; raise naming ``key`` otherwise."""
    from nxd_ckpt.errors import CheckpointError

    validate_tag(tag, key)
    if is_link(storage, tag):
        raise CheckpointError(f"{key}={tag!r}: {link_note(storage, tag)}; nxd reads and writes only inside "
                              f"{storage.describe('')} (copy the checkpoint in, or give its own folder)")
    return tag


@dataclass(frozen=True)
class TagInfo:
    tag: str
    complete: bool
    #: completion time (ns) written into ``done``; 0 for NxD checkpoints (their ``done`` says "1")
    completed_ns: int
    #: the directory holding it: the tag, or its complete ``.saving-`` temporary when a crash hit
    #: between committing an overwrite and moving it into place (committed later, so it wins)
    dir: str = ""

    @property
    def location(self) -> str:
        return self.dir or self.tag


def _natural(tag: str) -> list:
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", tag)]


def done_payload(metadata_digest: dict | None = None) -> bytes:
    """``done``: when the save completed and the checksum of the metadata it vouches for."""
    payload: dict = {"completed_ns": time.time_ns()}
    if metadata_digest is not None:
        payload["metadata"] = metadata_digest
    return json.dumps(payload).encode()


def parse_done(data: bytes) -> dict | None:
    """The ``done`` payload: nxd's JSON (``completed_ns``, a non-negative integer, and optionally the
    ``metadata`` digest), or {} for NxD's, which holds "1"; None for anything else (garbage, an empty
    file from a write that failed half-way): such a marker vouches for nothing."""
    try:
        text = data.decode().strip()
        if text == "1":
            return {}
        payload = json.loads(text)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(payload, dict) or type(payload.get("completed_ns")) is not int or payload["completed_ns"] < 0:
        return None
    if not isinstance(payload.get("metadata", {}), dict):
        return None
    return payload


def read_done(storage: Storage, tag: str) -> dict:
    """The ``done`` payload (see :func:`parse_done`); raises ``CorruptCheckpointError`` for a marker
    that is neither nxd's nor NxD's."""
    from nxd_ckpt.errors import CorruptCheckpointError

    if is_link(storage, f"{tag}/{DONE_MARKER}"):  # nxd writes markers as files: a link vouches for nothing
        raise CorruptCheckpointError(f"{link_note(storage, f'{tag}/{DONE_MARKER}')}, not a marker nxd writes: the "
                                     "checkpoint is not trusted as complete")
    with storage.open_read(f"{tag}/{DONE_MARKER}") as f:
        payload = parse_done(f.read())
    if payload is None:
        raise CorruptCheckpointError(
            f"{storage.describe(f'{tag}/{DONE_MARKER}')}: not a 'done' marker nxd or NxD writes (expected JSON with "
            "completed_ns, or \"1\"): the checkpoint is not trusted as complete")
    return payload


def read_completed_ns(storage: Storage, tag: str) -> int | None:
    """When ``tag`` completed (0 for NxD's marker); None when its marker is not valid (warned once)."""
    from nxd_ckpt.errors import CorruptCheckpointError

    try:
        return int(read_done(storage, tag).get("completed_ns", 0))
    except CorruptCheckpointError as exc:
        warn_once(f"{exc}; treated as incomplete")
        return None


_warned: set[str] = set()


def warn_once(message: str) -> None:
    """A warning this process prints once, however many readers come across the same thing; in a
    job of several ranks per node only local rank 0 prints it (the ranks of a node read the same
    storage: the same line from each would only repeat it)."""
    import warnings

    if os.environ.get("LOCAL_RANK", "0") != "0":
        return
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, UserWarning, stacklevel=3)


def list_tags(storage: Storage) -> list[TagInfo]:
    """Every checkpoint under the root (complete or not), oldest first. Temporaries of saves
    over an existing tag are not tags, but a complete one is the newest version of its tag."""
    infos: dict[str, TagInfo] = {}
    rescued = []
    for name in storage.list_dirs(""):
        if is_link(storage, name):  # another folder linked in: never loaded, counted, retired or cleaned up
            warn_once(f"{link_note(storage, name)}; nxd leaves it alone (not loaded, counted, retired or removed): "
                      "checkpoints of a run live in its own folder")
            continue
        files = set(storage.list_files(name))
        done_ns = read_completed_ns(storage, name) if DONE_MARKER in files else None
        if name.startswith(TEMP_PREFIX):
            if done_ns is not None:
                rescued.append(TagInfo(name[len(TEMP_PREFIX):], True, done_ns, name))
        elif name.startswith("."):
            continue
        elif done_ns is not None:
            infos[name] = TagInfo(name, True, done_ns)
        elif DONE_MARKER in files or CHECKPOINT_MARKER in files or "model" in storage.list_dirs(name):
            infos[name] = TagInfo(name, False, 0)
    for info in rescued:
        infos[info.tag] = info
    return sorted(infos.values(), key=lambda i: (i.completed_ns, _natural(i.tag)))


def checkpoint_dir(storage: Storage, tag: str) -> str | None:
    """The directory holding the complete checkpoint ``tag`` (see ``TagInfo.dir``), or None; a
    ``done`` marker that is not valid raises (``read_done``): it is named, never trusted or skipped."""
    for name in (temp_dir(tag), tag):
        if storage.exists(f"{name}/{DONE_MARKER}"):
            read_done(storage, name)
            return name
    return None


def complete_tags(storage: Storage) -> list[str]:
    """Complete checkpoints, oldest first (by the completion time recorded in ``done``)."""
    return [i.tag for i in list_tags(storage) if i.complete]


def newest_complete_tag(storage: Storage) -> str | None:
    """The newest complete tag by its ``done`` marker (the authority). When the ``newest`` pointer
    (kept for older NxD readers) names another tag, a missing or an incomplete one, warn once."""
    tags = complete_tags(storage)
    newest = tags[-1] if tags else None
    pointed = read_newest_pointer(storage)
    if pointed is not None and pointed != newest:
        state = "is complete but older" if pointed in tags else (
            "does not exist" if not storage.exists(pointed) else "is incomplete")
        warn_once(f"{storage.describe(NEWEST_POINTER)} names {pointed!r}, which {state}; using the newest complete "
                  f"checkpoint {newest!r} (by its 'done' marker)")
    return newest


def read_newest_pointer(storage: Storage) -> str | None:
    """The tag ``newest`` names; None (warned once) when it is a link or names no tag folder."""
    try:
        if is_link(storage, NEWEST_POINTER):
            warn_once(f"{link_note(storage, NEWEST_POINTER)}, not the pointer nxd writes; ignored (the 'done' "
                      "markers decide which checkpoint is newest)")
            return None
        if not storage.exists(NEWEST_POINTER):
            return None
        with storage.open_read(NEWEST_POINTER) as f:
            pointed = f.read().decode().strip() or None
    except (OSError, UnicodeDecodeError):
        return None
    if pointed is not None and name_problem(pointed) is not None:
        warn_once(f"{storage.describe(NEWEST_POINTER)} names {pointed!r}, which is not a tag folder name ("
                  f"{name_problem(pointed)}); ignored (the 'done' markers decide which checkpoint is newest)")
        return None
    return pointed


def write_newest_pointer(storage: Storage, tag: str | None) -> None:
    """Point ``newest`` at ``tag`` (None: remove it). If it cannot be written (ENOSPC...), remove it
    rather than leave it naming a tag retention may delete next; a warning says so."""
    try:
        if tag is None:
            if storage.exists(NEWEST_POINTER):
                storage.remove_file(NEWEST_POINTER)
            return
        with storage.open_write(NEWEST_POINTER) as f:
            f.write(tag.encode())
    except Exception as exc:  # noqa: BLE001 - a convenience pointer: never fail a committed save for it
        try:
            storage.remove_file(NEWEST_POINTER)
        except Exception:  # noqa: BLE001, S110 - already gone, or the storage refuses: readers check it
            pass
        warn_once(f"could not update {storage.describe(NEWEST_POINTER)} ({type(exc).__name__}: {exc}); removed it "
                  "so it names no stale checkpoint (readers use the 'done' markers)")
