"""NxD's ``modules.moe`` modules nxd-compat does not provide (Neuron kernels, inference, the layers
``ExpertMLPs`` stands for): each module's public names and what to use instead, in one place."""

from collections.abc import Callable
from typing import Any

from nxd_compat.surface import not_provided

_KERNEL = "NxD's Neuron (NKI) kernels and inference path; nxd-moe computes the experts with torch"

#: module -> (its public names in NxD, what to use[, more names, their reason])
NOT_PROVIDED: dict[str, tuple] = {
    # NxD's blockwise-matmul Neuron kernels (NKI), their selection and XLA slicing
    "blockwise": (("torch_to_nki_dtype", "initialize_nki_components", "initialize_training_kernels",
             "dynamic_slice_3D", "dynamic_slice_2D", "dynamic_slice_1D", "KernelConfig", "KernelAvailabilityError",
             "check_kernel_availability", "check_blockwise_mm_kernel_compatibility", "can_use_blockwise_matmul_nki",
             "BlockwiseMatmulNKIFunc", "BlockwiseMatmulMXNKIFunc",
             # NKI kernel enums and a kernel call NxD's own unit tests import
             "ActivationFunction", "BlockShardStrategy", "ExpertAffinityScaleMode", "LogicalNCConfig", "SkipMode",
             "_call_bwmm_shard_on_block_kernel"),
            _KERNEL + " (dynamic_slice_*: XLA's dynamic_slice through xla_call)",
            # NxD's argument holder of its NKI kernels (its defaults are the kernel enums)
            ("BlockwiseMatmulArgs",),
            "the argument holder of NxD's blockwise NKI kernels (its defaults are the kernel enums); NxD's torch "
            "reference TorchBlockwiseTraining takes its tensors directly"),
    # NxD's NKI kernel imports
    "nki_import": (("NKIImport", "import_nki", "import_nki_beta2"),
            _KERNEL),
    # NxD's fused token-generation MoE kernel (inference)
    "moe_fused_tkg": (("MoEFusedTKG", "_convert_torch_dtype_to_nki_dtype"),
            _KERNEL),
    # NxD's MXFP4 fused token-generation MoE kernel (inference)
    "moe_fused_tkg_mx": (("mxfp4_moe_block_tkg_wrapper", "MoEFusedTKGMX"),
            _KERNEL),
    # NxD's validator of its kernel/inference MoE configs
    "moe_config_validator": (("MoeConfigValidator",),
            _KERNEL),
    # NxD's inference expert MLPs
    "expert_mlps_v2": (("ExpertMLPsV2", "create_spmd_ranks", "duplicate_and_replace_prefixes",
             "can_use_find_index_kernel"),
            "NxD's inference ExpertMLPsV2 (RoutedExpertsMLPOpsConfig, kernels); training uses "
            'neuronx_distributed.modules.moe.ExpertMLPs'),
    # NxD's inference MoE TP/EP process groups
    "moe_process_group": (("init_tensor_expert_parallel_moe_process_groups", "get_moe_tp_ep_group",
             "get_moe_ep_group", "destroy_moe_model_parallel"),
            "NxD's inference MoE groups; training's expert-parallel groups come from "
            'initialize_model_parallel(expert_model_parallel_size=...) / the nxd config'),
}


def module_getattr(module: str) -> Callable[[str], Any]:
    """The ``__getattr__`` of NxD's module ``module`` (a full dotted name)."""
    entry = NOT_PROVIDED[module.rsplit(".", 1)[1]]
    reasons: dict[str, str] = {}
    for names, why in zip(entry[::2], entry[1::2], strict=True):
        reasons.update(dict.fromkeys(names, why))
    return not_provided(module, reasons)
