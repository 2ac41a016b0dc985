"""``neuronx_distributed.trainer.checkpoint``: NxD's checkpoint module. ``save_checkpoint`` /
``load_checkpoint`` are nxd-ckpt's (which read NxD's layout) with NxD's parameter names and NxD's
treatment of random states; ``has_checkpoint`` / ``finalize_checkpoint`` are nxd's;
``_xser_load_data`` reads one xser file as NxD's converter does, with torch alone."""

from typing import Any

import nxd
from nxd import finalize_checkpoint, has_checkpoint

__all__ = ["finalize_checkpoint", "has_checkpoint", "load_checkpoint", "save_checkpoint"]


# NxD's checkpoints hold no RNG states and its load_checkpoint changes none: a script that seeds,
# loads pretrained weights and then shuffles its data (NxD's fine-tuning example) draws the same
# order at every world size only if loading leaves the random streams alone. nxd's own
# save_checkpoint/load_checkpoint keep theirs (save_rng/load_rng, both on by default).
def save_checkpoint(checkpoint_dir_str: str, tag: str = "", model: Any = None, optimizer: Any = None,
                    scheduler: Any = None, user_content: Any = None, num_workers: int = 8, use_xser: bool = False,
                    num_kept_ckpts: int | None = None, async_save: bool = False, zero1_optimizer: bool = False,
                    **options: Any) -> None:
    """NxD's ``save_checkpoint`` (its parameter names); writes no RNG states, as NxD."""
    options.setdefault("save_rng", False)
    nxd.save_checkpoint(checkpoint_dir_str, tag, model=model, optimizer=optimizer, scheduler=scheduler,
                        user_content=user_content, num_workers=num_workers, use_xser=use_xser,
                        num_kept_ckpts=num_kept_ckpts, async_save=async_save, zero1_optimizer=zero1_optimizer,
                        **options)


def load_checkpoint(path: str, tag: str | None = None, model: Any = None, optimizer: Any = None, scheduler: Any = None,
                    num_workers: int = 8, strict: bool = True, **options: Any) -> Any:
    """NxD's ``load_checkpoint``; restores no RNG states (NxD's checkpoints have none), returns the user content."""
    options.setdefault("load_rng", False)
    return nxd.load_checkpoint(path, tag, model=model, optimizer=optimizer, scheduler=scheduler,
                               num_workers=num_workers, strict=strict, **options)


def _xser_load_data(checkpoint_dir: Any, path: str, groups: Any = None, ep_only: bool = False,
                    ignore_tensor_data: bool = False) -> Any:
    """The data of the xser file ``path`` (NxD's signature; this rank reads the whole file)."""
    from nxd_ckpt.xser import load

    if groups is not None or ep_only or ignore_tensor_data:
        raise NotImplementedError("_xser_load_data: groups / ep_only / ignore_tensor_data (NxD's broadcast and "
                                  "expert-parallel loading) are not provided; each rank reads its whole file")
    return load(path)
