"""Third-party import noise silenced where nxd imports those libraries: only the messages listed,
each on its own logger, so every other log record (and every warning) still reaches the user.

torchao logs a "Failed to load .../torchao/_C*.so" line for each prebuilt kernel library built for
another torch/CUDA (nxd's FP8 path uses torchao's Python float8 code, not those kernels), and its
import registers enums with torch's pytree, which logs a deprecation for each."""

from __future__ import annotations

import logging
import re

#: logger name -> the messages dropped from it (regular expressions, searched)
QUIET: dict[str, tuple[str, ...]] = {
    "torchao": (r"^Failed to load \S*torchao/_C\S*\.so",),
    "torch.utils._pytree": (r"is an Enum subclass and is now natively supported by torch\.compile",),
}


class _DropListed(logging.Filter):
    def __init__(self, patterns: tuple[str, ...]) -> None:
        super().__init__()
        self.patterns = [re.compile(p) for p in patterns]

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(p.search(message) for p in self.patterns)


def install() -> None:
    """Add the filters (idempotent); call before importing the library."""
    for name, patterns in QUIET.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropListed) for f in logger.filters):
            logger.addFilter(_DropListed(patterns))
