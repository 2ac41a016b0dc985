"""PyTorch Lightning on nxd: NxD's Neuron-PT-Lightning classes on native ``torch.distributed``.

An optional extra: ``pip install nxd-training[lightning]``. Importing this subpackage imports
``lightning``; nothing else in nxd-training does, so users without Lightning are unaffected.

Names follow NxD (``NeuronLTModule``, ``NeuronXLAStrategy``, ``NeuronXLAPrecisionPlugin``,
``NeuronCheckpointIO``, ``NeuronTensorBoardLogger``, ``NeuronTQDMProgressBar``); the hardware-neutral
names (``NxDStrategy``, ``NxDPrecisionPlugin``) are the same classes.
"""

from nxd_training.lightning import xm
from nxd_training.lightning.checkpoint_io import NeuronCheckpointIO
from nxd_training.lightning.data import NeuronDataLoader, NeuronLightningDataModule
from nxd_training.lightning.loggers import NeuronTensorBoardLogger, NeuronTQDMProgressBar, is_logging_rank
from nxd_training.lightning.module import NeuronLTModule
from nxd_training.lightning.precision import NeuronXLAPrecisionPlugin, NxDPrecisionPlugin
from nxd_training.lightning.strategy import NeuronXLAStrategy, NxDStrategy

__all__ = [
    "NeuronCheckpointIO", "NeuronDataLoader", "NeuronLTModule", "NeuronLightningDataModule", "NeuronTQDMProgressBar",
    "NeuronTensorBoardLogger", "NeuronXLAPrecisionPlugin", "NeuronXLAStrategy", "NxDPrecisionPlugin", "NxDStrategy",
    "is_logging_rank", "xm",
]
