"""Device backends: where tensors live, which process-group backend to use, how to synchronise.

The backend in use is the parallel context's (``nxd.get_parallel_context().backend``: the registered
backend whose ``process_group_backend`` the default process group runs). Before a context exists
it follows the default process group the same way, ``cpu`` without one; a user may pin it with
``NXD_BACKEND`` (e.g. ``xla`` for the XLA smoke test). Every lookup goes through ``nxd.get_backend``.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from typing import Any

import torch

import nxd


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
    """The backend in use: the parallel context's; else ``NXD_BACKEND`` if the user set it; else
    the one the default process group uses (NCCL -> cuda); else cpu."""
    context = nxd.current_parallel_context()
    if context is not None and context.backend is not None:
        return context.backend
    chosen = os.environ.get("NXD_BACKEND")
    if chosen:
        if chosen not in nxd.list_components("backend"):
            raise ValueError(f"NXD_BACKEND={chosen!r} is not a backend; valid: {', '.join(nxd.list_components('backend'))}")
        return nxd.get_backend(chosen)
    return nxd.parallel.backend_for_process_group()


def get_device() -> torch.device:
    return current_backend().device()


def synchronize() -> None:
    current_backend().synchronize()
