"""Finding a model's blocks: the outermost submodules of given classes (what activation
checkpointing, per-block compile and FSDP units wrap)."""

from __future__ import annotations

from torch import nn


def outermost_instances(model: nn.Module, classes: tuple[type, ...]) -> list[nn.Module]:
    """``model`` or its submodules that are instances of ``classes`` and not inside another such
    instance, in module order (a match's own submodules are not searched: they are inside it)."""
    found: list[nn.Module] = []

    def visit(module: nn.Module) -> None:
        if isinstance(module, classes):
            found.append(module)
            return
        for child in module.children():
            visit(child)

    if classes:
        visit(model)
    return found
