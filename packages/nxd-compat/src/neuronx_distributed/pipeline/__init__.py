"""``neuronx_distributed.pipeline``: pipeline parallelism (nxd-pipeline)."""

from nxd_pipeline import NxDPPModel

__all__ = ["NxDPPModel"]
