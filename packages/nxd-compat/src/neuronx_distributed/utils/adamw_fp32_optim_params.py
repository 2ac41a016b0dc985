"""``neuronx_distributed.utils.adamw_fp32_optim_params``: AdamW with fp32 optimizer states."""

from nxd_zero1.optim import AdamW_FP32OptimParams

__all__ = ["AdamW_FP32OptimParams"]
