"""A step's numbers (loss, grad norm, metrics) read back to the host one step late, so the step
itself never waits for the device: on CUDA the numbers are copied into pinned host memory with a
non-blocking copy enqueued right after the step's last kernel, and an event marks their arrival;
the loop reads them after it has launched the next step. On the CPU (and devices without this
path) the values are read at once, as before: nothing there runs ahead of the host."""

from __future__ import annotations

import time

import torch


class StepReadback:
    """``values()`` -> ``{name: float}`` of 0-dim tensors, and ``ready_s`` (perf_counter time the
    host had them)."""

    def __init__(self, values: dict[str, torch.Tensor]) -> None:
        self.names = list(values)
        self.ready_s: float | None = None
        self._event = None
        if not values:
            self._host: torch.Tensor | list[float] = []
            return
        flat = torch.stack([v.detach().float().reshape(()) for v in values.values()])
        if flat.device.type == "cuda":
            self._host = torch.empty(flat.shape, dtype=flat.dtype, pin_memory=True)
            self._host.copy_(flat, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record()
        else:
            self._host = flat.tolist()
            self.ready_s = time.perf_counter()

    def values(self) -> dict[str, float]:
        if self._event is not None:
            self._event.synchronize()  # the step that made them is done; later ones keep running
            self._host, self._event = self._host.tolist(), None
            self.ready_s = time.perf_counter()
        return dict(zip(self.names, self._host))
