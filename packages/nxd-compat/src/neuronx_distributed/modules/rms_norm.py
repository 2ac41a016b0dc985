"""``neuronx_distributed.modules.rms_norm``: RMSNorm with sequence-parallel tagging."""

from nxd_tensor_parallel.modules.rms_norm import *  # noqa: F403
