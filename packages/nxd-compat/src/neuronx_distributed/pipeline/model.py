"""``neuronx_distributed.pipeline.model``: NxD's module of ``NxDPPModel`` (nxd-pipeline's), with the
``parallel_state`` it reads its ranks from (NxD's unit tests patch the ranks through this path)."""

from neuronx_distributed.parallel_layers import parallel_state
from nxd_pipeline import NxDPPModel

__all__ = ["NxDPPModel", "parallel_state"]
