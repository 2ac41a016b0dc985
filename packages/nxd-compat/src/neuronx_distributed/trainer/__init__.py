"""``neuronx_distributed.trainer``: NxD's training entry points (nxd's facade)."""

from neuronx_distributed.trainer.checkpoint import load_checkpoint, save_checkpoint
from nxd import (
    finalize_checkpoint,
    has_checkpoint,
    initialize_parallel_model,
    initialize_parallel_optimizer,
    neuronx_distributed_config,
)

__all__ = [
    "finalize_checkpoint", "has_checkpoint", "initialize_parallel_model", "initialize_parallel_optimizer",
    "load_checkpoint", "neuronx_distributed_config", "save_checkpoint",
]
