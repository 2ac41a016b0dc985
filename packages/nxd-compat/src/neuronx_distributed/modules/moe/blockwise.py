"""``neuronx_distributed.modules.moe.blockwise``: NxD's blockwise-matmul Neuron kernels (NKI). Not provided by nxd-compat; its names
raise NotProvidedError saying what to use."""

from nxd_compat.surface import not_provided

_WHY = "NxD's Neuron (NKI) kernels and inference path; nxd-moe computes the experts with torch"
__getattr__ = not_provided(__name__, dict.fromkeys((
    'torch_to_nki_dtype', 'initialize_nki_components', 'initialize_training_kernels', 'dynamic_slice_3D',
    'dynamic_slice_2D', 'dynamic_slice_1D', 'BlockwiseMatmulArgs', 'get_data', 'TorchBlockwiseTraining',
    'KernelConfig', 'KernelAvailabilityError', 'check_kernel_availability',
    'check_blockwise_mm_kernel_compatibility', 'can_use_blockwise_matmul_nki',
    'augment_inputs_for_padded_blockwise_matmul', 'BlockwiseMatmulNKIFunc', 'BlockwiseMatmulMXNKIFunc',
), _WHY))
