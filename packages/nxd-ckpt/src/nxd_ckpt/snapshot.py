"""Copy state to host memory so a later training step cannot change what gets written."""

from __future__ import annotations

import collections
import copy
from collections.abc import Callable
from typing import Any

import torch

from nxd_ckpt.staging import Staging


def _rebuild(obj: Any, leaf: Any, path: tuple) -> Any:
    """``obj`` with every leaf replaced by ``leaf(value, path)`` (dicts, lists, tuples walked)."""
    if isinstance(obj, dict):
        out = {k: _rebuild(v, leaf, (*path, k)) for k, v in obj.items()}
        return collections.OrderedDict(out) if isinstance(obj, collections.OrderedDict) else out
    if isinstance(obj, list):
        return [_rebuild(v, leaf, (*path, i)) for i, v in enumerate(obj)]
    if isinstance(obj, tuple):
        items = [_rebuild(v, leaf, (*path, i)) for i, v in enumerate(obj)]
        return type(obj)(*items) if hasattr(obj, "_fields") else tuple(items)
    return leaf(obj, path)


def to_cpu(obj: Any, clone: bool) -> Any:
    """``obj`` with every tensor moved to CPU; ``clone=True`` copies CPU tensors too."""

    def leaf(v: Any, _: tuple) -> Any:
        if isinstance(v, torch.Tensor):
            t = v.detach()
            if t.device.type != "cpu":
                return t.to("cpu")
            return t.clone() if clone else t
        return copy.deepcopy(v) if clone else v

    return _rebuild(obj, leaf, ())


class SnapshotBuffers:
    """Host buffers reused from one asynchronous save to the next.

    A fresh ``clone()`` of every tensor costs an allocation and, for large tensors, the page faults
    of memory the kernel has to zero first; that (not the copy) dominated the time an async save
    blocked the training loop. After the first save a snapshot here is only a ``copy_`` into memory
    that is already mapped. The price is one snapshot's worth of host memory kept between saves
    (released by :meth:`release`, which ``finalize_checkpoint`` calls). Only the training thread
    touches the buffers, and only after the previous save has finished writing them.
    """

    def __init__(self) -> None:
        self._buffers: dict[tuple, torch.Tensor] = {}
        self._used: dict[tuple, torch.Tensor] = {}

    def snapshot(self, obj: Any, name: str, staging: Staging | None = None,
                 deferrable: Callable[[torch.Tensor], bool] = lambda _: True) -> Any:
        """A private copy of ``obj`` (tensors in reused host buffers keyed by ``name`` and their path).
        With ``staging``, the copy of each tensor ``deferrable`` accepts is left to it (see staging.py)."""

        def leaf(v: Any, path: tuple) -> Any:
            if not isinstance(v, torch.Tensor):
                return copy.deepcopy(v)
            t = v.detach()
            if t.layout != torch.strided or t.is_quantized or type(t) is not torch.Tensor:
                return t.to("cpu", copy=True)  # exotic tensors: a plain copy, no reuse
            buf = self._buffers.get(path)
            if buf is None or buf.shape != t.shape or buf.dtype != t.dtype:
                pin = t.device.type == "cuda"  # page-locked memory makes device-to-host copies faster
                buf = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=pin)
            if staging is not None and deferrable(v):
                staging.defer(buf, t)
            else:
                buf.copy_(t)
            self._used[path] = buf
            return buf

        return _rebuild(obj, leaf, (name,))

    def done(self) -> None:
        """End of one snapshot: forget buffers that it did not use (state that went away)."""
        self._buffers, self._used = self._used, {}

    def release(self) -> None:
        self._buffers, self._used = {}, {}

    @property
    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self._buffers.values())


def unwrap_model(model: Any) -> Any:
    """The module whose ``state_dict`` holds this rank's (global-named) parameters."""
    local = getattr(model, "local_module", None)
    return local() if callable(local) else model
