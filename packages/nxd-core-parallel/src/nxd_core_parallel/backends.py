"""Device backends: where tensors live, which process-group backend to use, how to synchronise.

The backend in use is the parallel context's (``context.backend``: the registered
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
import torch.distributed as dist

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


class AcceleratorBackend:
    """Any device ``torch.accelerator`` drives: CUDA, ROCm (as ``cuda``), XPU, MPS and out-of-tree
    devices (PrivateUse1, e.g. Trainium's native PyTorch device). The process group uses
    ``torch.distributed``'s default backend for that device type (nccl for cuda, xccl for xpu,
    the out-of-tree device's own registered one), so a new device needs no backend of its own.

    ``device_type=None`` (registered as ``accelerator``) follows the current accelerator;
    ``AcceleratorBackend("cuda")`` is the ``cuda`` backend."""

    #: a fallback in ``nxd.parallel.backend_for_process_group``: a backend named for the device wins
    generic = True

    def __init__(self, device_type: str | None = None) -> None:
        self._device_type = device_type
        self.generic = device_type is None
        self.name = device_type or "accelerator"

    @property
    def device_type(self) -> str | None:
        if self._device_type is not None:
            return self._device_type
        current = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
        return current.type if current is not None else None

    @property
    def process_group_backend(self) -> str | None:
        device_type = self.device_type
        if device_type is None:
            return None
        return dist.Backend.default_device_backend_map.get(device_type)

    def is_available(self) -> bool:
        current = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
        return current is not None and (self._device_type is None or current.type == self._device_type)

    def device(self) -> torch.device:
        device_type = self.device_type
        if device_type is None:
            raise RuntimeError("the accelerator backend found no accelerator (torch.accelerator.is_available() is "
                               "False); use the cpu backend")
        count = max(1, torch.accelerator.device_count())
        return torch.device(device_type, int(os.environ.get("LOCAL_RANK", "0")) % count)

    def synchronize(self) -> None:
        torch.accelerator.synchronize()

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)  # seeds the CPU and every accelerator device type torch knows


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


#: cpu (gloo), cuda (nccl), accelerator (whatever torch.accelerator drives) and xla
BACKENDS: dict[str, Any] = {"cpu": CpuBackend(), "cuda": AcceleratorBackend("cuda"), "accelerator": AcceleratorBackend(),
                            "xla": XlaBackend()}


def current_backend(context: nxd.ParallelContext | None = None) -> Any:
    """The backend in use: ``context``'s (the current one when left out); else ``NXD_BACKEND`` if
    the user set it; else the one the default process group uses (NCCL -> cuda); else cpu."""
    context = nxd.parallel.resolve_context(context)
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
