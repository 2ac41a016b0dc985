"""``NxDPrecisionPlugin`` (alias ``NeuronXLAPrecisionPlugin``).

nxd's optimizers (plain and ZeRO-1) run their own gradient sync and clipping in ``step()`` and take
no closure, so the plugin runs Lightning's closure (forward + backward) first, then steps.
``mixed_precision_enabled=True`` runs forward under ``torch.autocast(bfloat16)``; bf16 weights with
fp32 master copies come from ``nxd_config``'s ``mixed_precision_config`` (ZeRO-1), as in NxD.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Generator
from typing import Any

import torch
from lightning.pytorch.plugins.precision import Precision


class NxDPrecisionPlugin(Precision):
    def __init__(self, mixed_precision_enabled: bool = False) -> None:
        super().__init__()
        self.mixed_precision_enabled = mixed_precision_enabled
        self.precision = "bf16-mixed" if mixed_precision_enabled else "32-true"

    @contextlib.contextmanager
    def forward_context(self) -> Generator[None, None, None]:
        if not self.mixed_precision_enabled:
            yield
            return
        from nxd_core_parallel.backends import get_device

        with torch.autocast(device_type=get_device().type, dtype=torch.bfloat16):
            yield

    def optimizer_step(self, optimizer: Any, model: Any, closure: Callable[[], Any], **kwargs: Any) -> Any:
        result = closure()
        optimizer.step(**kwargs)
        return result


#: NxD's name for the same plugin.
NeuronXLAPrecisionPlugin = NxDPrecisionPlugin
