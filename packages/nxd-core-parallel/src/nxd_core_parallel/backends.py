"""Device backends: where tensors live, which process-group backend to use, how to synchronise.

``cpu`` (gloo) is the default; ``cuda`` (NCCL) when the default process group uses NCCL or a GPU
is present; ``xla`` (torch-xla, incl. Neuron) when selected with ``NXD_BACKEND=xla``. The
environment variable ``NXD_BACKEND`` always wins.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from typing import Any

import torch
import torch.distributed as dist


class CpuBackend:
    name = "cpu"
    process_group_backend = "gloo"

    def is_available(self) -> bool:
        return True

    def device(self) -> torch.device:
        return torch.device("cpu")

    def synchronize(self) -> None:
        """Nothing to wait for: CPU ops run eagerly."""

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)


class CudaBackend:
    name = "cuda"
    process_group_backend = "nccl"

    def is_available(self) -> bool:
        return torch.cuda.is_available()

    def device(self) -> torch.device:
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % max(1, torch.cuda.device_count()))

    def synchronize(self) -> None:
        torch.cuda.synchronize()

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)
        torch.cuda.manual_seed(seed)


class XlaBackend:
    """torch-xla (TPU, Trainium with torch-neuronx, or the XLA CPU device). Imported lazily: the
    CPU/CUDA environments do not have torch-xla installed."""

    name = "xla"
    process_group_backend = "xla"

    def is_available(self) -> bool:
        return importlib.util.find_spec("torch_xla") is not None

    def _xm(self) -> Any:
        if not self.is_available():
            raise RuntimeError("the xla backend needs torch-xla: pip install torch-xla (or torch-neuronx on Trainium)")
        return importlib.import_module("torch_xla.core.xla_model")

    def device(self) -> torch.device:
        return self._xm().xla_device()

    def synchronize(self) -> None:
        # XLA builds a lazy graph; mark_step cuts it and runs it.
        self._xm().mark_step()

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)
        self._xm().set_rng_state(seed)

    @property
    def is_neuron(self) -> bool:
        return importlib.util.find_spec("torch_neuronx") is not None


BACKENDS: dict[str, Any] = {"cpu": CpuBackend(), "cuda": CudaBackend(), "xla": XlaBackend()}


def current_backend() -> Any:
    """The backend in use: ``NXD_BACKEND`` if set, else follow the default process group
    (NCCL -> cuda), else cpu."""
    chosen = os.environ.get("NXD_BACKEND")
    if chosen:
        if chosen not in BACKENDS:
            raise ValueError(f"NXD_BACKEND={chosen!r} is not a backend; valid: {', '.join(BACKENDS)}")
        return BACKENDS[chosen]
    if dist.is_available() and dist.is_initialized():
        pg = dist.get_backend()
        if "nccl" in pg:
            return BACKENDS["cuda"]
        if "xla" in pg:
            return BACKENDS["xla"]
        return BACKENDS["cpu"]
    return BACKENDS["cpu"]


def get_device() -> torch.device:
    return current_backend().device()


def synchronize() -> None:
    current_backend().synchronize()
