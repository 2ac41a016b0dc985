"""``trainer.profile``: a torch.profiler trace (Chrome/Perfetto JSON) of chosen training steps."""

from __future__ import annotations

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

    def _last(self) -> int:
        assert self.config is not None
        return self.config.start_step + self.config.num_steps - 1

    def before_step(self, step: int) -> None:
        """Call with the 1-based number of the step about to run."""
        if self.config is None or step != self.config.start_step:
            return
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
        self.profiler.export_chrome_trace(str(path))
        self.profiler = None
        self.traces.append(path)
        return path
