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


class SnapshotBuffers:
    """Host buffers reused from one save to the next (every tensor of an asynchronous save; a
    synchronous save's device tensors, which have to reach host memory before they are written).

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
        self._device_copies: set[torch.device] = set()

    def snapshot(self, obj: Any, name: str, *, private: bool = True, staging: Staging | None = None,
                 deferrable: Callable[[torch.Tensor], bool] | None = None) -> Any:
        """A private copy of ``obj`` (tensors in reused host buffers keyed by ``name`` and their path).
        With ``staging``, the copy of each tensor ``deferrable`` accepts is left to it (see staging.py).
        ``private=False`` (a synchronous save): host tensors and other values are referenced, not
        copied; only device tensors are copied (call :meth:`done` before reading them)."""

        def leaf(v: Any, path: tuple) -> Any:
            if not isinstance(v, torch.Tensor):
                return copy.deepcopy(v) if private else v
            t = v.detach()
            if not private and t.device.type == "cpu":
                return t
            if t.layout != torch.strided or t.is_quantized or type(t) is not torch.Tensor:
                return t.to("cpu", copy=True)  # exotic tensors: a plain copy, no reuse
            buf = self._buffers.get(path)
            if buf is None or buf.shape != t.shape or buf.dtype != t.dtype:
                pin = t.device.type == "cuda"  # page-locked memory makes device-to-host copies faster
                buf = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=pin)
            if staging is not None and deferrable is not None and deferrable(v):
                staging.defer(buf, t)
            else:
                # into page-locked memory a device copy is asynchronous: all are queued, done() waits once
                buf.copy_(t, non_blocking=buf.is_pinned())
                if t.device.type == "cuda":
                    self._device_copies.add(t.device)
            self._used[path] = buf
            return buf

        return _rebuild(obj, leaf, (name,))

    def done(self) -> None:
        """End of one snapshot: wait for its device copies; forget buffers it did not use (state that went away)."""
        for device in self._device_copies:
            torch.cuda.current_stream(device).synchronize()
        self._device_copies = set()
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
