"""nxd's own warnings on a command line, one line each (``nxd: UserWarning: ...``): Python's default
format adds ``file:line:`` and the source line that warned (a line of nxd's code, which reads like a
fragment of a traceback to a user). Warnings from other libraries keep their format."""

from __future__ import annotations

import warnings
from pathlib import Path


def from_nxd(filename: str) -> bool:
    """A file of nxd's packages (``nxd``, ``nxd_ckpt``, ``nxd_training/config``, ...)."""
    return any(part == "nxd" or part.startswith("nxd_") for part in Path(filename).parts[-3:-1])


def install() -> None:
    """Format nxd's warnings as one line in this process (the CLI, each rank); idempotent."""
    previous = warnings.formatwarning
    if getattr(previous, "_nxd_one_line", False):
        return

    def one_line(message, category, filename, lineno, line=None):  # noqa: ANN001 - warnings' signature
        if from_nxd(filename):
            return f"nxd: {category.__name__}: {message}\n"
        return previous(message, category, filename, lineno, line)

    one_line._nxd_one_line = True  # type: ignore[attr-defined]
    warnings.formatwarning = one_line
