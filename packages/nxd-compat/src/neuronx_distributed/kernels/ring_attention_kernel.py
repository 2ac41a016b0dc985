"""``neuronx_distributed.kernels.ring_attention_kernel``: NxD's ring attention, on nxd's CP ring."""

from nxd_compat.kernels import nki_ring_attn_func

__all__ = ["nki_ring_attn_func"]
