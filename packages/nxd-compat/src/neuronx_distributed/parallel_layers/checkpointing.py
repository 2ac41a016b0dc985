"""``neuronx_distributed.parallel_layers.checkpointing``: NxD's older per-rank save/load calls.

nxd writes and reads checkpoints through ``neuronx_distributed.save_checkpoint`` /
``load_checkpoint`` (nxd-ckpt); these older entry points say so instead of guessing a layout.
"""

from typing import Any

_USE_INSTEAD = ("neuronx_distributed.parallel_layers.checkpointing.{name} is NxD's older per-rank checkpoint "
                "call; nxd-compat provides neuronx_distributed.save_checkpoint / load_checkpoint (same "
                "arguments path, tag, model, optimizer, ...) instead")


def save(*args: Any, **kwargs: Any) -> None:
    raise NotImplementedError(_USE_INSTEAD.format(name="save"))


def load(*args: Any, **kwargs: Any) -> Any:
    raise NotImplementedError(_USE_INSTEAD.format(name="load"))


def has_checkpoint(path: str) -> bool:
    from nxd import has_checkpoint as nxd_has_checkpoint

    return nxd_has_checkpoint(path)
