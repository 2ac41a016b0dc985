"""torch_xla.core.xla_model (nxd-compat stand-in): nxd-core-parallel's ``xla_model``, the one copy
of the ``xm`` calls NxD's examples make, on torch.distributed and nxd's device."""

from nxd_core_parallel.xla_model import *  # noqa: F403
from nxd_core_parallel.xla_model import __all__  # noqa: F401
