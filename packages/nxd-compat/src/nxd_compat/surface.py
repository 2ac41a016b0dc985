"""NxD names nxd-compat does not provide: an error that says what the name is and what to use."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn


class NotProvidedError(NotImplementedError):
    """An NxD name that nxd-compat knows but does not provide (never a bare AttributeError)."""


def not_provided(module: str, names: dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__``: each of NxD's ``names`` raises :class:`NotProvidedError` with its
    reason; any other name is an ordinary AttributeError (so ``hasattr`` and star imports work)."""

    def __getattr__(name: str) -> Any:
        if name in names:
            raise NotProvidedError(f"{module}.{name} (NxD) is not provided by nxd-compat: {names[name]}")
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__


def refuse_module(module: str, why: str) -> NoReturn:
    """The body of NxD's module ``module`` where nxd-compat provides none of it: importing it (or
    anything from it) raises NotProvidedError with ``why`` instead of ModuleNotFoundError."""
    raise NotProvidedError(f"{module} (NxD) is not provided by nxd-compat: {why}")
