"""``neuronx_distributed.kernels.flash_attn``: NxD's causal flash attention, on torch SDPA."""

from nxd_compat.kernels import nki_flash_attn_func

__all__ = ["nki_flash_attn_func"]
