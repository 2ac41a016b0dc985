"""Overlapped snapshots: an asynchronous save's copy runs while training goes on, until the state
would change.

Parameters and optimizer state change only in an optimizer step. An overlapped save therefore
returns after allocating its (reused) host buffers, without copying: device tensors are copied on a
side CUDA stream, host tensors by the writer thread before it writes. A global optimizer step
pre-hook makes the next ``step()`` of any ``torch.optim.Optimizer`` wait until the copy is complete
(for device tensors that wait is enqueued on the training stream, not on the host), so the loop
only stands still for whatever copy the forward and backward passes of the next step did not hide.
Anything else a save holds (buffers a forward may update, scheduler, user content, RNG states) is
still copied before the save returns. This is torchtitan's "staging" idea; as there, a loop that
changes parameters in place outside an optimizer step must not ask for it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook


class Staging:
    """The pending copies of one overlapped snapshot: ``(host buffer, source tensor)`` pairs."""

    def __init__(self, on_wait: Callable[[float], None] | None = None) -> None:
        self.copies: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._on_wait = on_wait
        self._host_done = threading.Event()
        self._event: torch.cuda.Event | None = None
        self._device: torch.device | None = None
        self._hook = None

    def defer(self, buf: torch.Tensor, src: torch.Tensor) -> None:
        self.copies.append((buf, src))

    def start(self) -> None:
        """On the training thread, right after the plan: enqueue the device copies, guard the next step."""
        device = [(b, s) for b, s in self.copies if s.device.type == "cuda"]
        self.copies = [(b, s) for b, s in self.copies if s.device.type != "cuda"]
        if device:
            self._device = device[0][1].device
            side = torch.cuda.Stream(device=self._device)
            side.wait_stream(torch.cuda.current_stream(self._device))  # the values as of now
            with torch.cuda.stream(side):
                for buf, src in device:
                    buf.copy_(src, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record(side)
        self._hook = register_optimizer_step_pre_hook(lambda *_: self.wait_before_step())

    def copy_on_writer(self) -> None:
        """On the writer thread, before it writes: the host copies, then the device copies' end."""
        try:
            for buf, src in self.copies:
                buf.copy_(src)
        finally:
            self._host_done.set()  # a failed copy fails the save; the step must not hang on it
        if self._event is not None:
            self._event.synchronize()

    def wait_before_step(self) -> None:
        """On the training thread, before the state changes: wait for the copy (once)."""
        if self._hook is None:
            return
        self._hook.remove()
        self._hook = None
        started = time.perf_counter()
        self._host_done.wait()
        if self._event is not None:  # the step's kernels queue behind the copy; the host goes on
            torch.cuda.current_stream(self._device).wait_event(self._event)
        if self._on_wait is not None:
            self._on_wait(time.perf_counter() - started)
