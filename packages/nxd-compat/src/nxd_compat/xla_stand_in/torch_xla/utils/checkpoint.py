"""torch_xla.utils.checkpoint (nxd-compat stand-in): torch's activation checkpointing."""

from typing import Any

import torch.utils.checkpoint


def checkpoint(function: Any, *args: Any, use_reentrant: bool = True, **kwargs: Any) -> Any:
    """torch-xla's default is the reentrant variant; so is this one."""
    return torch.utils.checkpoint.checkpoint(function, *args, use_reentrant=use_reentrant, **kwargs)
