"""Activation checkpointing (NxD's ``activation_checkpoint_config``) via ``torch.utils.checkpoint``.

Each selected module's ``forward`` is replaced on the instance by a checkpointed call, so
parameter names (and checkpoints) do not change. The TP RNG tracker's states are restored during
recomputation, so dropout inside ``get_rng_tracker().fork()`` draws the same mask twice.

Op-level checkpointing (``"op"``, torchtitan's selective-op mode) keeps the outputs of the
compute-heavy ops (:data:`SAVED_OPS`: matmuls, attention kernels, reduce-scatters) and recomputes
only the cheap ones (norms, activations, elementwise) in backward.
"""

from __future__ import annotations

import contextlib
import functools
import types
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from nxd_core_parallel.module_walk import outermost_instances
from nxd_core_parallel.random import get_rng_tracker

_MARK = "_nxd_activation_checkpointed"


class _RestoreRngStates:
    """Recompute context: run with the TP RNG states saved at forward time. Reusable, because
    autograd recomputes once per backward graph task: a backward split into separate input- and
    weight-gradient passes (zero-bubble pipelines) enters it more than once. ``inner``: a further
    recompute context entered inside it each time (op-level checkpointing's)."""

    def __init__(self, saved: Any, inner: Any = None) -> None:
        self._saved = saved
        self._inner = inner if inner is not None else contextlib.nullcontext()
        self._outer: list[Any] = []

    def __enter__(self) -> None:
        tracker = get_rng_tracker()
        self._outer.append(tracker.get_states())
        tracker.set_states(self._saved)
        self._inner.__enter__()

    def __exit__(self, *exc: object) -> None:
        try:
            self._inner.__exit__(*exc)
        finally:
            get_rng_tracker().set_states(self._outer.pop())


def _ops(*names: str) -> set[Any]:
    # ops a given torch build lacks (e.g. the flash kernels on some CPU builds) are skipped
    found = set()
    for name in names:
        namespace, op, overload = name.split(".")
        packet = getattr(getattr(torch.ops, namespace), op, None)
        if packet is not None and hasattr(packet, overload):
            found.add(getattr(packet, overload))
    return found


#: ops whose outputs op-level checkpointing keeps (torchtitan's save list: the ones that cost
#: FLOPs or communication to recompute)
SAVED_OPS = _ops(
    "aten.mm.default", "aten.addmm.default", "aten.bmm.default", "aten.baddbmm.default",
    "aten._scaled_dot_product_flash_attention.default",
    "aten._scaled_dot_product_efficient_attention.default",
    "aten._scaled_dot_product_flash_attention_for_cpu.default",
    "aten._scaled_dot_product_cudnn_attention.default",
    "_c10d_functional.reduce_scatter_tensor.default",
)


def _keep_compute_heavy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def _context_fn() -> tuple[Any, Any]:
    return contextlib.nullcontext(), _RestoreRngStates(get_rng_tracker().get_states())


def _op_level_context_fn() -> tuple[Any, Any]:
    forward_ctx, recompute_ctx = create_selective_checkpoint_contexts(_keep_compute_heavy)
    if torch.compiler.is_compiling():
        return forward_ctx, recompute_ctx
    return forward_ctx, _RestoreRngStates(get_rng_tracker().get_states(), recompute_ctx)


def _checkpointed_forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    # Bound to the instance with MethodType, so deepcopy re-binds it to the copy.
    forward = functools.partial(type(self).forward, self)
    if not torch.is_grad_enabled():
        return forward(*args, **kwargs)
    if getattr(self, _MARK) == "op":
        return checkpoint(forward, *args, use_reentrant=False, context_fn=_op_level_context_fn, **kwargs)
    if torch.compiler.is_compiling():
        # inside a compiled block (compile_config) the recomputation is part of the traced graph,
        # whose random ops replay their functionalised seeds: no eager RNG-restoring context needed
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)
    return checkpoint(forward, *args, use_reentrant=False, context_fn=_context_fn, **kwargs)


def apply_activation_checkpointing(model: nn.Module, classes: type | Iterable[type], *, op_level: bool = False) -> int:
    """Checkpoint every outermost submodule of ``model`` that is an instance of ``classes``;
    return how many were wrapped. ``op_level``: keep the outputs of :data:`SAVED_OPS` and
    recompute only the rest (torchtitan's selective-op checkpointing)."""
    wanted = (classes,) if isinstance(classes, type) else tuple(classes)
    if not wanted or not all(isinstance(c, type) and issubclass(c, nn.Module) for c in wanted):
        raise ValueError(f"activation checkpointing needs nn.Module classes, got {classes!r}")
    count = 0
    # nested matches are already inside the recomputation of their outermost block
    for module in outermost_instances(model, wanted):
        if not getattr(module, _MARK, False):
            module.forward = types.MethodType(_checkpointed_forward, module)
            setattr(module, _MARK, "op" if op_level else "full")
            count += 1
    return count


def _classes_named(model: nn.Module, names: Iterable[str]) -> tuple[type, ...]:
    wanted = set(names)
    return tuple(dict.fromkeys(type(m) for m in model.modules() if type(m).__name__ in wanted))


def transformer_layer_classes(model: nn.Module) -> tuple[type, ...]:
    """The classes ``"full"`` checkpointing recomputes: ``nxd_transformer_layer_classes`` of the
    model (looked up through wrappers such as adapters), else, for a Hugging Face model, the
    classes its ``_no_split_modules`` names (NxD's rule), found among the model's own modules."""
    seen: list[Any] = [model]
    while seen:
        obj = seen.pop()
        classes = getattr(type(obj), "nxd_transformer_layer_classes", None)
        if classes:
            return tuple(classes) if not isinstance(classes, type) else (classes,)
        no_split = getattr(obj, "_no_split_modules", None)
        if no_split and isinstance(obj, nn.Module):
            found = _classes_named(obj, no_split)
            if found:
                return found
        for attr in ("module", "model", "base_model"):
            inner = obj.__dict__.get("_modules", {}).get(attr)
            if inner is not None:
                seen.append(inner)
    raise ValueError(
        f"activation_checkpoint_config='full' needs the model class to define nxd_transformer_layer_classes "
        f"(a tuple of its transformer layer classes) or, for a Hugging Face model, _no_split_modules; "
        f"{type(model).__name__} has neither. Pass the classes explicitly instead: activation_checkpoint_config=[MyLayer]"
    )
