"""``trainer.profile``: a torch.profiler trace (Chrome/Perfetto JSON) of chosen training steps,
and with ``profile_memory`` the peak tensor memory of those steps on the CPU."""

from __future__ import annotations

import gc
import json
import warnings
from pathlib import Path
from typing import Any

import torch

from nxd_training.config.schema import ProfileConfig


class StepProfiler:
    """Starts a profiler before ``start_step`` and writes ``rank<r>-steps<a>-<b>.json`` after the
    last profiled step; a no-op when ``config`` is None."""

    def __init__(self, config: ProfileConfig | None, log_dir: Path, rank: int, device: torch.device) -> None:
        self.config = config
        self.folder = Path(config.dir) if config is not None and config.dir else Path(log_dir) / "profile"
        self.rank = rank
        self.device = device
        self.profiler: Any = None
        self.traces: list[Path] = []
        #: profile_memory on the CPU: bytes of live tensors when the window opened, and the peak
        #: over the window (that plus the allocator's high-water mark above it); None otherwise
        self.baseline_bytes: int | None = None
        self.peak_memory_bytes: int | None = None

    def _last(self) -> int:
        assert self.config is not None
        return self.config.start_step + self.config.num_steps - 1

    def before_step(self, step: int) -> None:
        """Call with the 1-based number of the step about to run."""
        if self.config is None or step != self.config.start_step:
            return
        if self.config.profile_memory and self.device.type == "cpu":
            self.baseline_bytes = live_tensor_bytes()
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self.profiler = torch.profiler.profile(
            activities=activities, record_shapes=self.config.record_shapes,
            profile_memory=self.config.profile_memory, with_stack=self.config.with_stack)
        self.profiler.__enter__()

    def after_step(self, step: int) -> Path | None:
        """Call with the 1-based number of the step that just ran; returns the trace once written."""
        if self.profiler is None or step < self._last():
            return None
        return self.stop(step)

    def stop(self, step: int) -> Path | None:
        """End a running profile early (the run stopped inside the window) and write what it has."""
        if self.profiler is None:
            return None
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.profiler.__exit__(None, None, None)
        self.folder.mkdir(parents=True, exist_ok=True)
        assert self.config is not None
        path = self.folder / f"rank{self.rank}-steps{self.config.start_step}-{step}.json"
        if self.baseline_bytes is not None:
            self.peak_memory_bytes = self.baseline_bytes + allocator_high_water(self.profiler)
            path.with_suffix(".memory.json").write_text(json.dumps(
                {"baseline_bytes": self.baseline_bytes, "peak_bytes": self.peak_memory_bytes}))
        self.profiler.export_chrome_trace(str(path))
        self.profiler = None
        self.traces.append(path)
        return path


def live_tensor_bytes() -> int:
    """Bytes of the CPU tensors alive now (each storage once): every tensor Python holds, and the
    gradients of parameters (held by C++ until read)."""
    seen: dict[int, int] = {}

    def count(t: Any) -> None:
        if isinstance(t, torch.Tensor) and t.device.type == "cpu" and not t.is_meta:
            try:
                storage = t.untyped_storage()
                ptr = storage.data_ptr()
            except RuntimeError:  # a storage FSDP2 freed (resized to 0 after resharding): holds nothing
                return
            if ptr:
                seen[ptr] = max(seen.get(ptr, 0), storage.nbytes())

    with warnings.catch_warnings():  # isinstance on some library objects warns (deprecated proxies)
        warnings.simplefilter("ignore")
        tensors = [obj for obj in gc.get_objects() if isinstance(obj, torch.Tensor)]
    for obj in tensors:
        count(obj)
        if isinstance(obj, torch.nn.Parameter):
            count(obj.grad)
            count(getattr(obj, "main_grad", None))
    return sum(seen.values())


def allocator_high_water(profiler: Any) -> int:
    """The CPU allocator's high-water mark (bytes above where it started) over a profile run with
    ``profile_memory``: the running sum of its allocation (+) and free (-) events."""
    events = sorted((e.start_ns(), e.nbytes()) for e in profiler.profiler.kineto_results.events()
                    if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU)
    live = peak = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    return peak
