"""What ``nxd-compat-run`` sets up so a script written for torch-xla runs on CPU or CUDA: the
``"xla"`` process-group backend (gloo on CPU, NCCL on CUDA), tensors created on ``device="xla"``
and moved with ``tensor.to("xla")`` landing on nxd's device. Only ever installed by the runner, and only when torch-xla is absent."""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist

_installed: list[Any] = []  # keeps the torch.library registration alive


def backend_name() -> str:
    """nxd's backend for the stand-in: NXD_BACKEND if set (never xla), else cuda when available, else cpu."""
    chosen = os.environ.get("NXD_BACKEND") or ("cuda" if torch.cuda.is_available() else "cpu")
    if chosen == "xla":
        raise RuntimeError("nxd-compat-run emulates torch-xla on CPU/CUDA; NXD_BACKEND=xla needs the real torch-xla")
    return chosen


def _make_process_group(store: Any, rank: int, size: int, timeout: Any) -> Any:
    if backend_name() == "cuda":
        return dist.ProcessGroupNCCL(store, rank, size)
    return dist.ProcessGroupGloo(store, rank, size, timeout)


def _empty_on_nxd_device(size: Any, *, dtype: Any = None, layout: Any = None, device: Any = None,
                         pin_memory: Any = None, memory_format: Any = None) -> torch.Tensor:
    from nxd_core_parallel.backends import get_device

    return torch.empty(size, dtype=dtype, layout=layout, device=get_device(), memory_format=memory_format)


def _is_xla(device: Any) -> bool:
    return (isinstance(device, str) and device.split(":")[0] == "xla") or (
        isinstance(device, torch.device) and device.type == "xla")


def _move_to_nxd_device(to: Any) -> Any:
    """``Tensor.to`` with an ``xla`` device read as nxd's device. Factory functions reach the
    ``empty`` registration below, but a copy to ``xla`` asks torch for XLA's device guard, which a
    CPU/CUDA build lacks (NxD's fine-tuning example moves its eval batches with ``.to("xla")``)."""
    from nxd_core_parallel.backends import get_device

    def moved(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        args = tuple(get_device() if _is_xla(a) else a for a in args)
        if _is_xla(kwargs.get("device")):
            kwargs["device"] = get_device()
        return to(self, *args, **kwargs)

    return moved


def _amp_definitely_not_available() -> bool:
    """torch's check before ``autocast("cuda")`` without the stand-in counted as torch-xla: torch takes
    any importable ``torch_xla`` for a real one and leaves CUDA autocast on without CUDA (raising for
    bfloat16) instead of warning and disabling itself, as it does in a plain torch process."""
    return not torch.cuda.is_available()


def count_only_real_torch_xla() -> None:
    """Make torch's CUDA-autocast check ignore the stand-in (see :func:`_amp_definitely_not_available`)."""
    import torch.cuda.amp.common as amp_common

    amp_common.amp_definitely_not_available = _amp_definitely_not_available


def install() -> None:
    """Register the ``xla`` process-group backend and the ``xla`` device allocation (idempotent)."""
    if _installed:
        return
    os.environ["NXD_BACKEND"] = backend_name()
    if "xla" not in dist.Backend.backend_list:
        dist.Backend.register_backend("xla", _make_process_group, devices=[backend_name()])
    library = torch.library.Library("aten", "IMPL")
    library.impl("empty.memory_format", _empty_on_nxd_device, "XLA")
    torch.Tensor.to = _move_to_nxd_device(torch.Tensor.to)
    count_only_real_torch_xla()
    _installed.append(library)


def installed() -> bool:
    return bool(_installed)
