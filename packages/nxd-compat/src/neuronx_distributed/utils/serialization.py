"""NxD's ``neuronx_distributed.utils.serialization``: not provided (importing it says why)."""

from nxd_compat.surface import refuse_module

refuse_module(__name__, "NxD's XLA/HLO tracing and Neuron inference (ModelBuilder, SPMD tracing, traced-model serialization); nxd trains eagerly on torch.distributed and does not trace")
