"""``neuronx_distributed.trainer.checkpoint``: NxD's checkpoint module. ``save_checkpoint`` /
``load_checkpoint`` / ``has_checkpoint`` / ``finalize_checkpoint`` are nxd-ckpt's (which read
NxD's layout); ``_xser_load_data`` reads one xser file as NxD's converter does, with torch alone."""

from typing import Any

from nxd import finalize_checkpoint, has_checkpoint, load_checkpoint, save_checkpoint

__all__ = ["finalize_checkpoint", "has_checkpoint", "load_checkpoint", "save_checkpoint"]


def _xser_load_data(checkpoint_dir: Any, path: str, groups: Any = None, ep_only: bool = False,
                    ignore_tensor_data: bool = False) -> Any:
    """The data of the xser file ``path`` (NxD's signature; this rank reads the whole file)."""
    from nxd_ckpt.xser import load

    if groups is not None or ep_only or ignore_tensor_data:
        raise NotImplementedError("_xser_load_data: groups / ep_only / ignore_tensor_data (NxD's broadcast and "
                                  "expert-parallel loading) are not provided; each rank reads its whole file")
    return load(path)
