"""PyTorch Lightning on nxd: NxD's Neuron-PT-Lightning classes on native ``torch.distributed``.

Its own distribution: ``pip install nxd-lightning`` (brings ``lightning``); the YAML trainer
(nxd-training) does not need it.

Names follow NxD (``NeuronLTModule``, ``NeuronXLAStrategy``, ``NeuronXLAPrecisionPlugin``,
``NeuronCheckpointIO``, ``NeuronTensorBoardLogger``, ``NeuronTQDMProgressBar``); the hardware-neutral
names (``NxDStrategy``, ``NxDPrecisionPlugin``) are the same classes.
"""

from nxd_lightning import xm
from nxd_lightning.checkpoint_io import NeuronCheckpointIO
from nxd_lightning.data import NeuronDataLoader, NeuronLightningDataModule
from nxd_lightning.loggers import NeuronTensorBoardLogger, NeuronTQDMProgressBar, is_logging_rank
from nxd_lightning.module import NeuronLTModule
from nxd_lightning.precision import NeuronXLAPrecisionPlugin, NxDPrecisionPlugin
from nxd_lightning.strategy import NeuronXLAStrategy, NxDStrategy

__all__ = [
    "NeuronCheckpointIO", "NeuronDataLoader", "NeuronLTModule", "NeuronLightningDataModule", "NeuronTQDMProgressBar",
    "NeuronTensorBoardLogger", "NeuronXLAPrecisionPlugin", "NeuronXLAStrategy", "NxDPrecisionPlugin", "NxDStrategy",
    "is_logging_rank", "xm",
]
