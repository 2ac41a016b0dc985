"""Checkpoint storages (plugins registered with ``nxd_register_storages`` by URL scheme).

A storage is bound to a root (``/data/ckpts``, ``s3://bucket/run1``) and works with ``/``-separated
paths relative to it. ``file`` writes with ``fsync`` so a ``done`` marker is only ever written
after the bytes it vouches for are on disk; every other scheme goes through fsspec.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO, Protocol


class Storage(Protocol):
    """What a storage plugin's factory returns for one root URL."""

    root: str

    def open_write(self, path: str) -> contextlib.AbstractContextManager[BinaryIO]: ...

    def open_read(self, path: str) -> contextlib.AbstractContextManager[BinaryIO]: ...

    def exists(self, path: str) -> bool: ...

    def list_dirs(self, path: str) -> list[str]: ...

    def list_files(self, path: str) -> list[str]: ...

    def remove_file(self, path: str) -> None: ...

    def remove_tree(self, path: str) -> None: ...

    def describe(self, path: str) -> str: ...


#: a storage plugin is a factory: (root url, storage_options) -> Storage
StorageFactory = Callable[[str, dict], Storage]


class LocalStorage:
    """The local (or network-mounted) filesystem."""

    def __init__(self, root: str, options: dict | None = None) -> None:
        self.root = root[len("file://"):] if root.startswith("file://") else root
        self.fsync = bool((options or {}).get("fsync", True))

    def _p(self, path: str) -> str:
        return os.path.join(self.root, *path.split("/")) if path else self.root

    def describe(self, path: str) -> str:
        return self._p(path)

    def is_link(self, path: str) -> bool:
        """``path`` is a symbolic link (optional Storage method: storages without links lack it)."""
        return os.path.islink(self._p(path))

    def link_target(self, path: str) -> str:
        return os.path.realpath(self._p(path))

    @contextlib.contextmanager
    def open_write(self, path: str) -> Iterator[BinaryIO]:
        full = self._p(path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        if os.path.islink(full):  # a link where nxd writes a file: replace the link, never write through it
            os.remove(full)
        with open(full, "wb") as f:
            yield f
            f.flush()
            if self.fsync:
                os.fsync(f.fileno())

    @contextlib.contextmanager
    def open_read(self, path: str) -> Iterator[BinaryIO]:
        with open(self._p(path), "rb") as f:
            yield f

    def exists(self, path: str) -> bool:
        return os.path.exists(self._p(path))

    def list_dirs(self, path: str) -> list[str]:
        full = self._p(path)
        if not os.path.isdir(full):
            return []
        return sorted(e.name for e in os.scandir(full) if e.is_dir())

    def list_files(self, path: str) -> list[str]:
        full = self._p(path)
        if not os.path.isdir(full):
            return []
        return sorted(e.name for e in os.scandir(full) if e.is_file())

    def remove_file(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.remove(self._p(path))

    def remove_tree(self, path: str) -> None:
        if os.path.exists(self._p(path)):
            shutil.rmtree(self._p(path))

    def rename(self, src: str, dst: str) -> None:
        """Atomic directory rename (optional Storage method; used to swap in an overwrite)."""
        os.rename(self._p(src), self._p(dst))
        if self.fsync:  # make the rename itself durable
            fd = os.open(os.path.dirname(self._p(dst)) or ".", os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


#: S3 fault handling: seconds to connect / wait for a read, and attempts per request. The SDK's and
#: s3fs's own defaults (60 s timeouts, retries with backoff in both layers) take ~40 s or more to
#: report an unreachable endpoint; a training job usually wants to know sooner.
S3_TIMEOUT_ENV, S3_RETRIES_ENV = "NXD_CKPT_S3_TIMEOUT", "NXD_CKPT_S3_RETRIES"


def _s3_options(options: dict) -> tuple[dict, int | None]:
    """``options`` with ``timeout``/``retries`` (or the environment's) turned into s3fs/botocore
    settings; returns them and s3fs's own retry count (None: its default)."""
    options = dict(options)
    timeout = options.pop("timeout", os.environ.get(S3_TIMEOUT_ENV))
    retries = options.pop("retries", os.environ.get(S3_RETRIES_ENV))
    config = dict(options.get("config_kwargs") or {})
    if timeout is not None:
        config.setdefault("connect_timeout", float(timeout))
        config.setdefault("read_timeout", float(timeout))
    if retries is not None:
        config.setdefault("retries", {"max_attempts": int(retries), "mode": "standard"})
    if config:
        options["config_kwargs"] = config
    return options, int(retries) if retries is not None else None


class FsspecStorage:
    """Any fsspec filesystem (``s3://``, ``gs://``, ``memory://``, ...). ``storage_options`` go
    to the filesystem (for S3, e.g. ``{"client_kwargs": {"endpoint_url": ...}}``; the standard
    ``AWS_ENDPOINT_URL`` and credential variables work too). For S3, ``timeout`` (seconds) and
    ``retries`` (attempts per request), or the ``NXD_CKPT_S3_TIMEOUT`` / ``NXD_CKPT_S3_RETRIES``
    environment variables, bound how long a network fault takes to surface."""

    def __init__(self, root: str, options: dict | None = None) -> None:
        import fsspec

        self.root = root.rstrip("/")
        options, retries = _s3_options(options or {}) if self.root.startswith(("s3://", "s3a://")) else (options, None)
        self.fs, self._base = fsspec.core.url_to_fs(self.root, **(options or {}))
        if retries is not None:
            self.fs.retries = max(retries, 1)  # s3fs's own retry loop around each call
        self._base = self._base.rstrip("/")

    def _p(self, path: str) -> str:
        return f"{self._base}/{path}" if path else self._base

    def describe(self, path: str) -> str:
        return f"{self.root}/{path}" if path else self.root

    @contextlib.contextmanager
    def open_write(self, path: str) -> Iterator[BinaryIO]:
        with self.fs.open(self._p(path), "wb") as f:
            yield f
        self.fs.invalidate_cache(self._p(path).rsplit("/", 1)[0])

    @contextlib.contextmanager
    def open_read(self, path: str) -> Iterator[BinaryIO]:
        with self.fs.open(self._p(path), "rb") as f:
            yield f

    def exists(self, path: str) -> bool:
        self.fs.invalidate_cache(self._p(path))
        return bool(self.fs.exists(self._p(path)))

    def _entries(self, path: str) -> list[dict[str, Any]]:
        self.fs.invalidate_cache(self._p(path))
        try:
            return list(self.fs.ls(self._p(path), detail=True))
        except FileNotFoundError:
            return []

    def list_dirs(self, path: str) -> list[str]:
        return sorted(e["name"].rstrip("/").rsplit("/", 1)[-1] for e in self._entries(path) if e["type"] == "directory")

    def list_files(self, path: str) -> list[str]:
        return sorted(e["name"].rsplit("/", 1)[-1] for e in self._entries(path) if e["type"] == "file")

    def remove_file(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(self._p(path))
        self.fs.invalidate_cache(self._p(path).rsplit("/", 1)[0])

    def remove_tree(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm(self._p(path), recursive=True)
        self.fs.invalidate_cache(self._p(path))

    def copy_file(self, src: str, dst: str) -> None:
        """Server-side copy where the filesystem has one (optional Storage method)."""
        self.fs.copy(self._p(src), self._p(dst))
        self.fs.invalidate_cache(self._p(dst).rsplit("/", 1)[0])


BUILTIN_STORAGES: dict[str, StorageFactory] = {"file": LocalStorage, "s3": FsspecStorage, "memory": FsspecStorage}


def scheme_of(url: str) -> str:
    return url.split("://", 1)[0] if "://" in url else "file"


def open_storage(url: str, options: dict | None = None) -> Storage:
    """The storage for ``url``: the plugin registered for its scheme, else fsspec if it knows it."""
    import nxd

    scheme = scheme_of(url)
    try:
        factory = nxd.get_storage(scheme)
    except nxd.ComponentNotFound:
        factory = BUILTIN_STORAGES.get(scheme)
        if factory is None:
            import fsspec

            if scheme not in fsspec.available_protocols():
                raise
            factory = FsspecStorage
    return factory(url, dict(options or {}))
