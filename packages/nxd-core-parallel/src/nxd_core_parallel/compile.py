"""``torch.compile`` per transformer block (torchtitan's way): each block is compiled in place with
``nn.Module.compile``, so parameter names, state dicts, activation checkpointing (compiled together
with the block's recomputation) and pipeline cuts between blocks stay as they are in eager mode."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from torch import nn

from nxd.config import DEFAULT_COMPILE_CONFIG
from nxd_core_parallel.module_walk import outermost_instances


def compile_blocks(model: nn.Module, classes: type | Iterable[type], options: dict[str, Any] | None = None) -> int:
    """Compile every outermost submodule of ``model`` that is an instance of ``classes`` in place;
    return how many were compiled (0 means nothing matched: the caller decides whether that is an error)."""
    wanted = (classes,) if isinstance(classes, type) else tuple(classes)
    kwargs = {**DEFAULT_COMPILE_CONFIG, **(options or {})}
    kwargs = {k: v for k, v in kwargs.items() if k in DEFAULT_COMPILE_CONFIG and v is not None}
    blocks = outermost_instances(model, wanted)  # a nested block is inside its outer block's compiled region
    for block in blocks:
        block.compile(**kwargs)
    return len(blocks)
