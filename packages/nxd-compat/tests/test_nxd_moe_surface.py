"""Every public name of NxD's ``neuronx_distributed.modules.moe`` modules (Release 2.29, listed from
NxD's source) imports from nxd-compat or raises NotProvidedError saying what to use (never an
ImportError / AttributeError), and the classes nxd-compat provides take every constructor argument
NxD's define (an argument nxd cannot honour is refused by name when set, tests/test_nxd_moe_api.py)."""

from __future__ import annotations

import importlib
import inspect

import pytest

pytest.importorskip("nxd_moe")

#: module -> its top-level public classes and functions in NxD (src/neuronx_distributed/modules/moe)
NXD_MOE_NAMES = {
    "blockwise": ("torch_to_nki_dtype", "initialize_nki_components", "initialize_training_kernels", "dynamic_slice_3D",
                  "dynamic_slice_2D", "dynamic_slice_1D", "BlockwiseMatmulArgs", "get_data", "TorchBlockwiseTraining",
                  "KernelConfig", "KernelAvailabilityError", "check_kernel_availability",
                  "check_blockwise_mm_kernel_compatibility", "can_use_blockwise_matmul_nki",
                  "augment_inputs_for_padded_blockwise_matmul", "BlockwiseMatmulNKIFunc", "BlockwiseMatmulMXNKIFunc"),
    "expert_mlps": ("ExpertMLPs",),
    "expert_mlps_v2": ("ExpertMLPsV2", "create_spmd_ranks", "duplicate_and_replace_prefixes",
                       "can_use_find_index_kernel"),
    "experts": ("Experts",),
    "loss_function": ("load_balancing_loss_func",),
    "model": ("MoE",),
    "model_utils": ("ACT2FN", "GLUType", "ACTFunc", "get_kernel_activation_func_id", "create_spmd_ranks"),
    "moe_config_validator": ("MoeConfigValidator",),
    "moe_configs": ("to_torch_dtype", "BlockwiseMatmulConfig", "RoutedExpertsMLPOpsConfig", "RouterConfig",
                    "MoEFusedTKGConfig"),
    "moe_fused_tkg": ("MoEFusedTKG",),
    "moe_fused_tkg_mx": ("mxfp4_moe_block_tkg_wrapper", "MoEFusedTKGMX"),
    "moe_parallel_layers": ("ExpertFusedLinearWithAsyncCommunication", "ExpertFusedLinear",
                            "ExpertFusedColumnParallelLinear", "ExpertFusedRowParallelLinear"),
    "moe_process_group": ("init_tensor_expert_parallel_moe_process_groups", "get_moe_tp_ep_group", "get_moe_ep_group",
                          "destroy_moe_model_parallel"),
    "nki_import": ("NKIImport", "import_nki", "import_nki_beta2"),
    "routing": ("RouterBase", "RouterTopK", "RouterSinkhorn", "GroupLimitedRouter"),
    "shared_experts": ("ColumnParallelLinearTransposed", "RowParallelLinearTransposed", "SharedExperts"),
    "token_shuffling": ("token_shuffle", "all_to_all_for_shuffle", "token_unshuffle"),
}
#: NxD's package __init__ exports
NXD_MOE_EXPORTS = ("ExpertMLPs", "load_balancing_loss_func", "MoE", "ACT2FN", "RouterSinkhorn", "RouterTopK")
#: (module, class) -> NxD's constructor arguments
NXD_CONSTRUCTORS = {
    ("model", "MoE"): ("router", "expert_mlps", "shared_experts", "rmsnorm", "sequence_parallel_enabled",
                       "sequence_dimension", "return_router_logits", "return_expert_index", "token_shuffle_group_size",
                       "token_shuffle_seed", "tensor_model_parallel_group", "init_tkg_module", "tkg_config"),
    ("routing", "RouterTopK"): ("num_experts", "top_k", "hidden_size", "sequence_parallel_enabled", "sequence_dimension",
                                "dtype", "device", "bias", "tensor_model_parallel_group", "act_fn",
                                "apply_act_fn_over_topk", "jitter_eps", "store_transposed_weights"),
    ("routing", "RouterSinkhorn"): ("num_experts", "top_k", "hidden_size", "act_fn", "sequence_parallel_enabled",
                                    "sequence_dimension", "dtype", "device", "sinkhorn_iterations", "sinkhorn_tol"),
    ("moe_parallel_layers", "ExpertFusedColumnParallelLinear"): (
        "num_experts", "input_size", "output_size", "bias", "dtype", "device", "stride", "init_method",
        "keep_master_weight", "tensor_model_parallel_group", "expert_model_parallel_group", "is_prefill",
        "is_fused_gate_up", "expert_distribution"),
    ("moe_parallel_layers", "ExpertFusedRowParallelLinear"): (
        "num_experts", "input_size", "output_size", "bias", "reduce_output", "dtype", "device", "stride",
        "init_method", "keep_master_weight", "tensor_model_parallel_group", "expert_model_parallel_group",
        "is_prefill", "is_fused_gate_up", "expert_distribution"),
    ("experts", "Experts"): ("num_experts", "hidden_size", "intermediate_size", "glu", "activation_fn", "dtype",
                             "device", "bias", "glu_type", "hidden_act_scaling_factor", "hidden_act_bias",
                             "gate_clamp_upper_limit", "gate_clamp_lower_limit", "up_clamp_upper_limit",
                             "up_clamp_lower_limit", "input_layer_init_method", "output_layer_init_method",
                             "is_prefill", "tensor_model_parallel_group", "expert_model_parallel_group",
                             "expert_distribution"),
    ("routing", "RouterBase"): ("num_experts", "top_k", "hidden_size", "act_fn", "sequence_parallel_enabled",
                                "sequence_dimension", "dtype", "device", "bias", "tensor_model_parallel_group",
                                "jitter_eps", "store_transposed_weights", "apply_act_fn_over_topk"),
    ("routing", "GroupLimitedRouter"): ("num_experts", "top_k", "hidden_size", "n_group", "topk_group",
                                        "sequence_parallel_enabled", "sequence_dimension", "dtype", "device",
                                        "tensor_model_parallel_group", "jitter_eps"),
    ("shared_experts", "SharedExperts"): ("hidden_size", "intermediate_size", "num_shared_experts", "hidden_act",
                                          "dtype", "tensor_model_parallel_group", "reduce_dtype",
                                          "fused_gate_up_projection", "sequence_parallel_enabled",
                                          "transpose_weights"),
}


def test_every_nxd_moe_name_resolves_or_says_what_to_use():
    from nxd_compat.surface import NotProvidedError

    provided, refused = [], []
    for module, names in NXD_MOE_NAMES.items():
        mod = importlib.import_module(f"neuronx_distributed.modules.moe.{module}")
        for name in names:
            try:
                getattr(mod, name)
                provided.append(f"{module}.{name}")
            except NotProvidedError as err:
                assert "nxd-compat" in str(err) and len(str(err)) > 80, (module, name, err)
                refused.append(f"{module}.{name}")
    package = importlib.import_module("neuronx_distributed.modules.moe")
    assert all(hasattr(package, name) for name in NXD_MOE_EXPORTS)
    print(f"\nNxD moe names: {len(provided)} provided, {len(refused)} refused with a reason")
    assert len(provided) == 24


def test_provided_classes_take_nxds_constructor_arguments():
    for (module, cls), nxd_args in NXD_CONSTRUCTORS.items():
        ours = inspect.signature(getattr(importlib.import_module(f"neuronx_distributed.modules.moe.{module}"), cls))
        assert not [a for a in nxd_args if a not in ours.parameters], cls
    # ExpertMLPs: NxD's 47 arguments; its Neuron-kernel options arrive through **kernel_options
    from neuronx_distributed.modules.moe.expert_mlps import ExpertMLPs

    assert inspect.signature(ExpertMLPs).parameters["kernel_options"].kind is inspect.Parameter.VAR_KEYWORD
