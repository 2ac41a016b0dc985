"""One live writer per run directory: a second ``nxd train`` into the same ``version_N`` would
interleave metrics and replace the other's checkpoints. The lock is an ``flock`` on
``<log_dir>/.nxd-run.lock``, so the kernel drops it when the holder dies (no stale locks)."""

from __future__ import annotations

import fcntl
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from nxd.errors import ConfigError

LOCK_NAME = ".nxd-run.lock"


@contextmanager
def run_dir_lock(log_dir: Path) -> Iterator[None]:
    """Hold the run directory's lock for the duration; refuse if another live process holds it."""
    log_dir.mkdir(parents=True, exist_ok=True)
    path = log_dir / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 256, 0).decode(errors="replace").strip() or "another process"
            raise ConfigError(
                f"{log_dir} is in use by a running nxd train ({holder}); wait for it to finish, or write "
                "elsewhere (exp_manager.explicit_log_dir / exp_manager.version)"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}".encode(), 0)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock
