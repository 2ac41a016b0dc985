"""``neuronx_distributed.trainer``: NxD's training entry points (nxd's facade)."""

from typing import Any, Callable

import torch

import nxd
from neuronx_distributed.trainer import checkpoint_storage  # noqa: F401 - NxD's package imports it
from neuronx_distributed.trainer.checkpoint import load_checkpoint, save_checkpoint
from nxd import (
    finalize_checkpoint,
    has_checkpoint,
    initialize_parallel_optimizer,
    neuronx_distributed_config,
)
from nxd_compat.surface import not_provided

__all__ = [
    "finalize_checkpoint", "has_checkpoint", "initialize_parallel_model", "initialize_parallel_optimizer",
    "load_checkpoint", "neuronx_distributed_config", "save_checkpoint",
]


def initialize_parallel_model(nxd_config: dict, model_fn: Callable[..., torch.nn.Module], *args: Any,
                              **model_kwargs: Any) -> torch.nn.Module:
    """NxD's ``initialize_parallel_model`` in both of its signatures: ``(nxd_config, model_fn,
    include_buffers=False, *model_args, **model_kwargs)`` since Release 2.21, and
    ``(nxd_config, model_fn, *model_args, **model_kwargs)`` up to 2.20, which NxD's examples of
    those releases call with ``model_fn``'s argument third (``get_model(flags)``). A third argument
    that is not a bool can only be the older call's first model argument."""
    if args and not isinstance(args[0], bool):
        args = (False, *args)  # NxD <= 2.20 had no include_buffers: buffers were built as usual
    return nxd.initialize_parallel_model(nxd_config, model_fn, *args, **model_kwargs)

__getattr__ = not_provided(__name__, {
    "PostPartitionHooks": "NxD's hooks run after its traced pipeline partitioning; nxd-pipeline does not trace "
                          "(NxDPPModel cuts through declared methods)"})
