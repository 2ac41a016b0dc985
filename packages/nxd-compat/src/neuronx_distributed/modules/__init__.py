"""``neuronx_distributed.modules``: GQA QKV projection, RMSNorm, LoRA, MoE."""

from neuronx_distributed.modules import qkv_linear, rms_norm  # noqa: F401
