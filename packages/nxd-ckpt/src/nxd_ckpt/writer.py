"""The background writer: at most one asynchronous save in flight; its failure is kept and
raised by the next save, load or ``finalize_checkpoint``."""

from __future__ import annotations

import threading
from collections.abc import Callable

from nxd_ckpt.errors import CheckpointError


class AsyncWriter:
    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._what = ""

    @property
    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def submit(self, job: Callable[[], None], what: str) -> None:
        self.wait()

        def run() -> None:
            try:
                job()
            except BaseException as exc:  # noqa: BLE001 - handed to the training thread by wait()
                self._error = exc

        self._what = what
        # Not a daemon: the interpreter waits for an in-flight save before exiting.
        self._thread = threading.Thread(target=run, name="nxd-ckpt-writer", daemon=False)
        self._thread.start()

    def wait(self) -> None:
        """Block until the in-flight save ends; raise its error if it failed."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            if isinstance(error, CheckpointError):
                raise error
            raise CheckpointError(f"asynchronous save of {self._what} failed: {error}") from error
