"""``neuronx_distributed.trainer``: NxD's training entry points (nxd's facade)."""

from neuronx_distributed.trainer import checkpoint_storage  # noqa: F401 - NxD's package imports it
from neuronx_distributed.trainer.checkpoint import load_checkpoint, save_checkpoint
from neuronx_distributed.trainer.trainer import (
    initialize_parallel_model,
    initialize_parallel_optimizer,
    neuronx_distributed_config,
)
from nxd import finalize_checkpoint, has_checkpoint
from nxd_compat.surface import not_provided

__all__ = [
    "finalize_checkpoint", "has_checkpoint", "initialize_parallel_model", "initialize_parallel_optimizer",
    "load_checkpoint", "neuronx_distributed_config", "save_checkpoint",
]


__getattr__ = not_provided(__name__, {
    "PostPartitionHooks": "NxD's hooks run after its traced pipeline partitioning; nxd-pipeline does not trace "
                          "(NxDPPModel cuts through declared methods)"})
