"""torch_xla.distributed.parallel_loader (nxd-compat stand-in): batches moved to nxd's device."""

from collections.abc import Iterator
from typing import Any

import torch


def _to(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, dict):
        return type(batch)((k, _to(v, device)) for k, v in batch.items())
    if isinstance(batch, (list, tuple)):
        return type(batch)(_to(v, device) for v in batch)
    return batch


class MpDeviceLoader:
    """Iterates ``loader`` and moves each batch to ``device``."""

    def __init__(self, loader: Any, device: Any, **kwargs: Any) -> None:
        self._loader, self._device = loader, torch.device(device) if isinstance(device, str) else device

    def __iter__(self) -> Iterator[Any]:
        for batch in self._loader:
            yield _to(batch, self._device)

    def __len__(self) -> int:
        return len(self._loader)


class ParallelLoader:
    def __init__(self, loader: Any, devices: list[Any], **kwargs: Any) -> None:
        self._loader, self._device = loader, devices[0]

    def per_device_loader(self, device: Any) -> MpDeviceLoader:
        return MpDeviceLoader(self._loader, device)
