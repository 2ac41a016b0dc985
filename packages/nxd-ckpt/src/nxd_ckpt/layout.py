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
import re
import time
from dataclasses import dataclass

from nxd_ckpt.storage import Storage

CHECKPOINT_MARKER = "checkpoint"
DONE_MARKER = "done"
NEWEST_POINTER = "newest"
METADATA = "metadata.json"
#: a save over an existing complete tag is written here and swapped in after its ``done`` marker;
#: tags never start with '.', so no tag can collide with it
TEMP_PREFIX = ".saving-"


def temp_dir(tag: str) -> str:
    return f"{TEMP_PREFIX}{tag}"


def shard_name(dp_rank: int, tp_rank: int, pp_rank: int, suffix: str = ".pt") -> str:
    return f"dp_rank_{dp_rank:02d}_tp_rank_{tp_rank:02d}_pp_rank_{pp_rank:02d}{suffix}"


_SHARD_RE = re.compile(r"^dp_rank_(\d+)(?:_ep_rank_\d+)?_tp_rank_(\d+)_pp_rank_(\d+)(\.\w+)$")


def parse_shard_name(name: str) -> tuple[int, int, int, str] | None:
    """``(dp, tp, pp, suffix)`` of a shard file name, or None for other files."""
    m = _SHARD_RE.match(name)
    return (int(m[1]), int(m[2]), int(m[3]), m[4]) if m else None


def rng_name(rank: int) -> str:
    return f"rng/rank_{rank:05d}.pt"


def validate_tag(tag: str) -> str:
    if not isinstance(tag, str) or not tag or "/" in tag or tag in (".", "..") or tag.startswith("."):
        raise ValueError(f"checkpoint tag must be a non-empty name without '/' or a leading '.', got {tag!r}")
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


def read_done(storage: Storage, tag: str) -> dict:
    """The ``done`` payload ({} for NxD's ``done``, which holds "1")."""
    try:
        with storage.open_read(f"{tag}/{DONE_MARKER}") as f:
            data = json.loads(f.read().decode() or "0")
        return data if isinstance(data, dict) else {}
    except (ValueError, UnicodeDecodeError):
        return {}


def read_completed_ns(storage: Storage, tag: str) -> int:
    try:
        return int(read_done(storage, tag).get("completed_ns", 0))
    except (TypeError, ValueError):
        return 0


def list_tags(storage: Storage) -> list[TagInfo]:
    """Every checkpoint under the root (complete or not), oldest first. Temporaries of saves
    over an existing tag are not tags, but a complete one is the newest version of its tag."""
    infos: dict[str, TagInfo] = {}
    rescued = []
    for name in storage.list_dirs(""):
        files = set(storage.list_files(name))
        if name.startswith(TEMP_PREFIX):
            if DONE_MARKER in files:
                rescued.append(TagInfo(name[len(TEMP_PREFIX):], True, read_completed_ns(storage, name), name))
        elif name.startswith("."):
            continue
        elif DONE_MARKER in files:
            infos[name] = TagInfo(name, True, read_completed_ns(storage, name))
        elif CHECKPOINT_MARKER in files or "model" in storage.list_dirs(name):
            infos[name] = TagInfo(name, False, 0)
    for info in rescued:
        infos[info.tag] = info
    return sorted(infos.values(), key=lambda i: (i.completed_ns, _natural(i.tag)))


def checkpoint_dir(storage: Storage, tag: str) -> str | None:
    """The directory holding the complete checkpoint ``tag`` (see ``TagInfo.dir``), or None."""
    for name in (temp_dir(tag), tag):
        if storage.exists(f"{name}/{DONE_MARKER}"):
            return name
    return None


def complete_tags(storage: Storage) -> list[str]:
    """Complete checkpoints, oldest first (by the completion time recorded in ``done``)."""
    return [i.tag for i in list_tags(storage) if i.complete]


def newest_complete_tag(storage: Storage) -> str | None:
    tags = complete_tags(storage)
    return tags[-1] if tags else None
