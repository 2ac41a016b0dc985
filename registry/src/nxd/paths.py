"""One path policy for every name nxd turns into a path: checkpoint tags, experiment names and
versions, the checkpoint ``filename`` template, the ``newest`` pointer's content, the files a
Hugging Face index names, ``nxd ckpt --tag``.

A name either resolves inside the folder it belongs to or is refused, naming the key (or file) it
came from. Symbolic links are resolved before the check, so a link inside a run that points out of
it is refused too: nxd never reads, writes or deletes outside the folders it was given.
"""

from __future__ import annotations

import os

from nxd.errors import ConfigError


class PathEscapeError(ConfigError):
    """A name that would leave the folder it belongs to (or is no usable name at all)."""


def name_problem(value: object) -> str | None:
    """Why ``value`` is not one plain path component (None when it is)."""
    if not isinstance(value, str) or not value:
        return "must be a non-empty name"
    if "/" in value or "\\" in value:
        return "must be one name, without '/' or '\\'"
    if value in (".", "..") or value.startswith("."):
        return "must not be '.' or '..' or start with '.'"
    if "\0" in value:
        return "must not hold a NUL character"
    return None


def check_name(value: object, key: str) -> str:
    """``value`` as one path component (a tag, an experiment name, a version), or raise naming ``key``."""
    problem = name_problem(value)
    if problem is not None:
        raise PathEscapeError(f"{key}={value!r} {problem}: it names a folder inside its parent, so it cannot "
                              "leave it (an absolute path or '..' would read or write outside the run)")
    return value  # type: ignore[return-value]


def check_relative(value: object, key: str) -> str:
    """``value`` as a relative path of plain components (``shards/model-00001.safetensors``), or raise."""
    if not isinstance(value, str) or not value or os.path.isabs(value) or value.startswith(("/", "\\")):
        raise PathEscapeError(f"{key}={value!r} must be a relative path inside its folder")
    for part in value.replace("\\", "/").split("/"):
        if part in ("", ".", "..") or "\0" in part:
            raise PathEscapeError(f"{key}={value!r} leaves its folder or is not a plain relative path "
                                  "('..', '.', an empty or absolute part)")
    return value


def is_inside(root: str, path: str) -> bool:
    """``path`` is ``root`` or below it once symbolic links are resolved (local paths only)."""
    real_root, real = os.path.realpath(root), os.path.realpath(path)
    return real == real_root or real.startswith(real_root.rstrip(os.sep) + os.sep)


def resolve_inside(root: str, rel: str, key: str) -> str:
    """``root/rel`` for a relative ``rel`` that stays inside ``root`` after resolving symbolic
    links; raise naming ``key`` otherwise. URLs (``s3://...``) are checked by name only."""
    check_relative(rel, key)
    path = os.path.join(root, rel)
    if "://" not in root and not is_inside(root, path):
        raise PathEscapeError(f"{key}={rel!r}: {path} resolves to {os.path.realpath(path)}, outside {root} "
                              "(a symbolic link out of it); nxd does not follow it")
    return path
