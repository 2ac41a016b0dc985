"""``neuronx_distributed`` on nxd (installed by the opt-in ``nxd-compat`` distribution).

NxD Core's import name and module tree, mapped onto nxd's implementations so NxD scripts run
unchanged on CPU (gloo), CUDA (NCCL) or XLA. Importing it says once that this is nxd, and says
loudly when a real ``neuronx-distributed`` is installed too.
"""

from nxd_compat.notice import announce

announce()

from neuronx_distributed import kernels, modules, optimizer, parallel_layers, pipeline, trainer, utils  # noqa: E402

# NxD's top-level entry points are its trainer's (as NxD's own __init__ imports them)
from neuronx_distributed.trainer import *  # noqa: E402, F403

__version__ = "0.1.0+nxd"

__all__ = ["kernels", "modules", "optimizer", "parallel_layers", "pipeline", "trainer", "utils", *trainer.__all__]
