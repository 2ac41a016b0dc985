"""``neuronx_distributed.utils``."""

from neuronx_distributed.utils import adamw_fp32_optim_params, batch_utils, logger, model_utils  # noqa: F401
from neuronx_distributed.utils.utils import HloMetadataLevel, hardware

__all__ = ["HloMetadataLevel", "hardware"]
