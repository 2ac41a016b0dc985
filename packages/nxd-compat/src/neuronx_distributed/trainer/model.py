"""``neuronx_distributed.trainer.model``: ``NxDModel``, what ``initialize_parallel_model`` returns (nxd-core-parallel's)."""

from nxd_core_parallel.trainer import NxDModel

__all__ = ["NxDModel"]
