"""``neuronx_distributed.modules.moe.moe_fused_tkg_mx``: NxD's MXFP4 fused token-generation MoE kernel (inference). Not provided by nxd-compat; its names
raise NotProvidedError saying what to use."""

from nxd_compat.surface import not_provided

_WHY = "NxD's Neuron (NKI) kernels and inference path; nxd-moe computes the experts with torch"
__getattr__ = not_provided(__name__, dict.fromkeys((
    'mxfp4_moe_block_tkg_wrapper', 'MoEFusedTKGMX',
), _WHY))
