"""The background writer: at most one asynchronous save in flight; its failure is kept and
raised by the next save, load or ``finalize_checkpoint``.

One long-lived worker thread takes jobs from a queue: handing a job over is a queue put, where
starting a thread per save made the training thread wait for the new thread to be scheduled
(milliseconds on a busy host). The worker is a daemon so it never keeps a finished program alive
by itself; an ``atexit`` hook waits for the in-flight save, so exiting normally never loses one,
and reports on stderr a save that failed with nobody left to raise it to (a job whose training
thread already died).
"""

from __future__ import annotations

import atexit
import os
import queue
import sys
import threading
import weakref
from collections.abc import Callable

from nxd_ckpt.errors import CheckpointError


class AsyncWriter:
    def __init__(self) -> None:
        self._jobs: queue.Queue[Callable[[], None]] = queue.Queue()
        self._idle = threading.Event()
        self._idle.set()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._what = ""
        ref = weakref.ref(self)
        atexit.register(lambda: (w := ref()) is not None and w._at_exit())
        # a forked child has no worker thread: start it afresh instead of waiting on the parent's job
        os.register_at_fork(after_in_child=lambda: (w := ref()) is not None and w._reset())

    def _reset(self) -> None:
        self._jobs = queue.Queue()
        self._idle = threading.Event()
        self._idle.set()
        self._thread, self._error = None, None

    def _at_exit(self) -> None:
        self._idle.wait()
        if self._error is not None:
            print(f"nxd-ckpt: the asynchronous save of {self._what} was not committed: {self._error}",
                  file=sys.stderr, flush=True)

    @property
    def busy(self) -> bool:
        return not self._idle.is_set()

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                job()
            except BaseException as exc:  # noqa: BLE001 - handed to the training thread by wait()
                self._error = exc
            finally:
                self._idle.set()

    def submit(self, job: Callable[[], None], what: str) -> None:
        self.wait()
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="nxd-ckpt-writer", daemon=True)
            self._thread.start()
        self._what = what
        self._idle.clear()
        self._jobs.put(job)

    def wait(self) -> None:
        """Block until the in-flight save ends; raise its error if it failed."""
        self._idle.wait()
        if self._error is not None:
            error, self._error = self._error, None
            if isinstance(error, CheckpointError):
                raise error
            raise CheckpointError(f"asynchronous save of {self._what} failed: {error}") from error
