"""NxD's Lightning names on nxd's Lightning support, plus ``NeuronHooksCallback``."""

from __future__ import annotations

from typing import Any

try:
    import nxd_lightning as _impl
except ImportError as exc:
    raise ImportError("neuronx_distributed.lightning needs nxd's Lightning support: "
                      "pip install nxd-compat[lightning]", name="neuronx_distributed.lightning") from exc

from lightning.pytorch.callbacks import Callback

NeuronCheckpointIO = _impl.NeuronCheckpointIO
NeuronLTModule = _impl.NeuronLTModule
NeuronTensorBoardLogger = _impl.NeuronTensorBoardLogger
NeuronTQDMProgressBar = _impl.NeuronTQDMProgressBar
NeuronXLAPrecisionPlugin = _impl.NeuronXLAPrecisionPlugin
NeuronXLAStrategy = _impl.NeuronXLAStrategy


class NeuronHooksCallback(Callback):
    """NxD's debugging callback that dumps layer activations/gradients when ``cfg.hooks`` is set.
    With ``hooks`` off (the examples' default) it does nothing, as in NxD; the dumps themselves are
    not provided by nxd-compat and are refused."""

    def __init__(self, cfg: Any) -> None:
        super().__init__()
        self.hooks = bool(getattr(cfg, "hooks", False))
        if self.hooks:
            raise NotImplementedError("NeuronHooksCallback with hooks enabled (activation/gradient dumps) is not "
                                      "provided by nxd-compat; run with hooks disabled")


__all__ = [
    "NeuronCheckpointIO", "NeuronHooksCallback", "NeuronLTModule", "NeuronTQDMProgressBar", "NeuronTensorBoardLogger",
    "NeuronXLAPrecisionPlugin", "NeuronXLAStrategy",
]
