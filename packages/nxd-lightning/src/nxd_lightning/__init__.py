"""PyTorch Lightning on nxd: NxD's Neuron-PT-Lightning classes on native ``torch.distributed``.

Its own distribution: ``pip install nxd-lightning`` (brings ``lightning``); the YAML trainer
(nxd-training) does not need it.

Names follow NxD (``NeuronLTModule``, ``NeuronXLAStrategy``, ``NeuronXLAPrecisionPlugin``,
``NeuronCheckpointIO``, ``NeuronTensorBoardLogger``, ``NeuronTQDMProgressBar``); the hardware-neutral
names (``NxDStrategy``, ``NxDPrecisionPlugin``) are the same classes.
"""

from __future__ import annotations

import importlib
from typing import Any

#: public name -> the submodule defining it. Imported on first use (PEP 562): the nxd plugin
#: manager loads ``nxd_lightning.plugin`` in every ``nxd`` command and rank, and importing
#: ``lightning`` there would cost every one of them ~20 s.
_EXPORTS = {
    "xm": "nxd_lightning.xm",
    "NeuronCheckpointIO": "nxd_lightning.checkpoint_io",
    "NeuronDataLoader": "nxd_lightning.data", "NeuronLightningDataModule": "nxd_lightning.data",
    "NeuronTensorBoardLogger": "nxd_lightning.loggers", "NeuronTQDMProgressBar": "nxd_lightning.loggers",
    "is_logging_rank": "nxd_lightning.loggers",
    "NeuronLTModule": "nxd_lightning.module",
    "NeuronXLAPrecisionPlugin": "nxd_lightning.precision", "NxDPrecisionPlugin": "nxd_lightning.precision",
    "NeuronXLAStrategy": "nxd_lightning.strategy", "NxDStrategy": "nxd_lightning.strategy",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'nxd_lightning' has no attribute {name!r}")
    value = importlib.import_module(module)
    if name != "xm":
        value = getattr(value, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
