"""The ``torch_xla.core.xla_model`` calls NxD's Lightning examples make, on ``torch.distributed``:
``import torch_xla.core.xla_model as xm`` becomes ``from nxd_lightning import xm``. The calls live
once, in nxd-core-parallel's ``xla_model`` (nxd-compat's ``torch_xla`` stand-in uses the same)."""

from nxd_core_parallel.xla_model import *  # noqa: F403
from nxd_core_parallel.xla_model import __all__  # noqa: F401
