"""nxd-compat's stand-in for torch-xla (put on the path by ``nxd-compat-run`` only when torch-xla is
absent). The calls NxD's examples make, on torch.distributed and nxd's device."""

import torch as _torch

from nxd_compat import xla_emulation as _emulation

_emulation.install()
NXD_STAND_IN = True
__version__ = "0.0.0+nxd-compat"


def device(index: int | None = None) -> _torch.device:
    from torch_xla.core.xla_model import xla_device

    return xla_device()
