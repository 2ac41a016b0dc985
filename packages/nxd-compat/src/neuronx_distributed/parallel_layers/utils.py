"""``neuronx_distributed.parallel_layers.utils``: sharding attributes and small helpers."""

from nxd_core_parallel.parallel_layers.utils import *  # noqa: F403


def requires_init_pg_override() -> bool:
    """NxD: whether ``init_process_group("xla")`` needs torch-xla's ``pjrt://`` init method (torch
    2.0 only). nxd's torch is newer: False, the plain ``init_process_group`` call is taken."""
    return False


def get_local_world_size() -> int:
    """Processes on this host: torchrun's ``LOCAL_WORLD_SIZE``, else the whole world (one host)."""
    import os

    import torch.distributed as dist

    if "LOCAL_WORLD_SIZE" in os.environ:
        return int(os.environ["LOCAL_WORLD_SIZE"])
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
