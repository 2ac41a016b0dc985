"""Ctrl-C during ``nxd train``: one line instead of every rank's and torchrun's tracebacks.

The line says where the run stopped, its last complete checkpoint and the command that resumes
it. What the ranks and torchrun write to stderr after the interrupt (their KeyboardInterrupt /
``SignalException`` tracebacks) goes to ``<run dir>/interrupted.log`` instead of the terminal.
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
import threading
from pathlib import Path
from typing import IO

from nxd_training.config.schema import ExpManagerConfig
from nxd_training.exp_manager import checkpoint_dir, is_url, read_metrics

#: exit code of a run stopped with Ctrl-C (128 + SIGINT, as a shell reports it)
INTERRUPTED = 130
#: exit codes of a job stopped by a signal to `nxd train` (SIGINT, SIGTERM, SIGHUP): 128 + the signal
STOPPED = (INTERRUPTED, 128 + signal.SIGTERM, 128 + signal.SIGHUP)
INTERRUPTED_LOG = "interrupted.log"


class StderrRelay:
    """Copies a child's stderr to ours, byte for byte (progress bars included), until :meth:`mute`;
    from then on to ``log_path``."""

    TAIL_BYTES = 1 << 16

    def __init__(self, stream: IO[bytes], log_path: Path) -> None:
        self._fd = stream.fileno()
        self._log_path = log_path
        self._tail = bytearray()  # the last TAIL_BYTES, for the launcher's final diagnosis
        self._muted = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nxd-stderr-relay", daemon=True)
        self._thread.start()

    def mute(self) -> None:
        self._muted.set()

    def join(self, timeout: float = 10.0) -> None:
        self._thread.join(timeout)

    def tail(self) -> str:
        """The end of what the child wrote to stderr (after :meth:`join`)."""
        return bytes(self._tail).decode(errors="replace")

    def _run(self) -> None:
        # Never stop reading: a full pipe would block every rank's next write to stderr.
        log = None
        while True:
            try:
                chunk = os.read(self._fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            self._tail += chunk
            del self._tail[:-self.TAIL_BYTES]
            try:
                if not self._muted.is_set():
                    _write_stderr(chunk)
                    continue
                if log is None:
                    log = self._log_path.open("ab")
                log.write(chunk)
            except Exception:  # noqa: BLE001 - our stderr or the log went away: drop this chunk, keep draining
                pass
        if log is not None:
            log.close()


def _write_stderr(chunk: bytes) -> None:
    buffer = getattr(sys.stderr, "buffer", None)
    if buffer is not None:
        buffer.write(chunk)
        buffer.flush()
    else:  # a text-only stream (e.g. one a caller swapped in)
        sys.stderr.write(chunk.decode(errors="replace"))
        sys.stderr.flush()


def last_checkpoint(em: ExpManagerConfig, log_dir: Path) -> tuple[str, int | None] | None:
    """``(tag, step)`` of the newest complete checkpoint of the run, or None."""
    path = checkpoint_dir(em, log_dir)
    if not is_url(path) and not Path(path).is_dir():
        return None
    from nxd_ckpt.convert import read_user_content
    from nxd_ckpt.layout import newest_complete_tag
    from nxd_ckpt.storage import open_storage

    try:
        tag = newest_complete_tag(open_storage(path))
        if tag is None:
            return None
        content = read_user_content(path, tag)
    except Exception:  # noqa: BLE001 - the summary must not fail; the checkpoint is checked on resume
        return None
    step = content.get("step") if isinstance(content, dict) else None
    return tag, int(step) if step is not None else None


def resume_command(em: ExpManagerConfig, log_dir: Path) -> str:
    """The command that continues the run in ``log_dir`` from its newest complete checkpoint."""
    command = f"nxd train {shlex.quote(str(log_dir / 'config.yaml'))}"
    return command if em.resume_if_exists else command + " exp_manager.resume_if_exists=true"


def stopped_message(em: ExpManagerConfig, log_dir: Path, by: str = "") -> str:
    """``nxd train: stopped at step N; last complete checkpoint: step M (<tag>); resume: nxd train ...``
    (``stopped by SIGTERM at step N`` when ``by`` names the signal; Ctrl-C's line names none)."""
    from nxd_training.rank_status import completed_step

    step = completed_step(log_dir)  # the ranks' own count: metrics.jsonl lags by up to log_every_n_steps - 1
    if step is None:
        try:
            records = read_metrics(log_dir, filename=em.metrics_file)
        except (OSError, ValueError):
            records = []
        step = records[-1]["step"] if records else 0
    command = resume_command(em, log_dir)
    last = last_checkpoint(em, log_dir)
    if last is None:
        return f"nxd train: stopped{by and ' by ' + by} at step {step}; no complete checkpoint yet, so a rerun starts over: {command}"
    tag, saved = last
    where = f"step {saved} ({tag})" if saved is not None else tag
    return f"nxd train: stopped{by and ' by ' + by} at step {step}; last complete checkpoint: {where}; resume with: {command}"
