"""``neuronx_distributed.parallel_layers.utils``: sharding attributes and small helpers."""

from nxd_core_parallel.parallel_layers.utils import *  # noqa: F403


def requires_init_pg_override() -> bool:
    """NxD: whether ``init_process_group("xla")`` needs torch-xla's ``pjrt://`` init method (torch
    2.0 only). nxd's torch is newer: False, the plain ``init_process_group`` call is taken."""
    return False
