"""``torch.compile`` per transformer block (torchtitan's way): each block is compiled in place with
``nn.Module.compile``, so parameter names, state dicts, activation checkpointing (compiled together
with the block's recomputation) and pipeline cuts between blocks stay as they are in eager mode."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from torch import nn

from nxd.config import DEFAULT_COMPILE_CONFIG


def compile_blocks(model: nn.Module, classes: type | Iterable[type], options: dict[str, Any] | None = None) -> int:
    """Compile every outermost submodule of ``model`` that is an instance of ``classes`` in place;
    return how many were compiled (0 means nothing matched: the caller decides whether that is an error)."""
    wanted = (classes,) if isinstance(classes, type) else tuple(classes)
    kwargs = {**DEFAULT_COMPILE_CONFIG, **(options or {})}
    kwargs = {k: v for k, v in kwargs.items() if k in DEFAULT_COMPILE_CONFIG and v is not None}
    count = 0

    def visit(module: nn.Module) -> None:
        nonlocal count
        if isinstance(module, wanted):
            module.compile(**kwargs)
            count += 1
            return  # a nested block is inside this compiled region
        for child in module.children():
            visit(child)

    visit(model)
    return count
