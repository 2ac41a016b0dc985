"""``neuronx_distributed`` on nxd (installed by the opt-in ``nxd-compat`` distribution).

NxD Core's import name and module tree, mapped onto nxd's implementations so NxD scripts run
unchanged on CPU (gloo), CUDA (NCCL) or XLA. Importing it says once that this is nxd, and says
loudly when a real ``neuronx-distributed`` is installed too.
"""

from nxd_compat.notice import announce

announce()

from neuronx_distributed import kernels, modules, optimizer, parallel_layers, pipeline, trainer, utils  # noqa: E402
from neuronx_distributed.trainer.checkpoint import load_checkpoint, save_checkpoint  # noqa: E402
from nxd import (  # noqa: E402
    finalize_checkpoint,
    has_checkpoint,
    initialize_parallel_model,
    initialize_parallel_optimizer,
    neuronx_distributed_config,
)

__version__ = "0.1.0+nxd"

__all__ = [
    "finalize_checkpoint", "has_checkpoint", "initialize_parallel_model", "initialize_parallel_optimizer", "kernels",
    "load_checkpoint", "modules", "neuronx_distributed_config", "optimizer", "parallel_layers", "pipeline",
    "save_checkpoint", "trainer", "utils",
]
