"""Every ``neuronx_distributed`` name NxD's own unit tests import (aws-neuron/neuronx-distributed
``test/unit_test`` at fbac349, Release 2.29: 187 names, listed from its sources) resolves through
nxd-compat or raises NotProvidedError saying why (never ModuleNotFoundError / ImportError /
AttributeError); the pure-torch helpers provided for them compute NxD's results. Which of NxD's
unit-test files pass here: docs/migration.md (item 15), tests/nxd_unit_tests."""

from __future__ import annotations

import importlib

import pytest
import torch

#: module.name (or a module) imported by NxD's unit tests
NXD_UNIT_TEST_NAMES = """
neuronx_distributed
neuronx_distributed.experimental.quantization.microscaling.expert_mlps_mx.all_expert_mlps_act_mxfp8_w_mxfp4
neuronx_distributed.experimental.quantization.microscaling.expert_mlps_mx.all_expert_mlps_bf16
neuronx_distributed.experimental.quantization.microscaling.expert_mlps_mx.select_expert_mlps_bf16
neuronx_distributed.experimental.quantization.microscaling.mx_torch.dequantize_mx_tensor
neuronx_distributed.experimental.quantization.microscaling.mx_torch.matmul_mx
neuronx_distributed.experimental.quantization.microscaling.mx_torch.matmul_mx_single_tile
neuronx_distributed.experimental.quantization.microscaling.mx_torch.quantize_mxfp8
neuronx_distributed.experimental.quantization.microscaling.swizzle.swizzle_tensor
neuronx_distributed.experimental.quantization.microscaling.swizzle.swizzle_tiled_tensor
neuronx_distributed.experimental.quantization.microscaling.swizzle.unswizzle_tensor
neuronx_distributed.lightning.checkpoint_io.NeuronCheckpointIO
neuronx_distributed.modules.attention.utils.apply_rotary_polar_compatible
neuronx_distributed.modules.attention.utils.precompute_freqs_cis
neuronx_distributed.modules.lora.LoraConfig
neuronx_distributed.modules.lora.LoraModel
neuronx_distributed.modules.lora.get_lora_model
neuronx_distributed.modules.lora.layer.LoraConv2d
neuronx_distributed.modules.lora.layer.LoraEmbedding
neuronx_distributed.modules.lora.layer.LoraLinear
neuronx_distributed.modules.lora.tp_layer.LoraGQAQKVParallelLinear
neuronx_distributed.modules.lora.tp_layer.LoraParallelLinear
neuronx_distributed.modules.moe.ACT2FN
neuronx_distributed.modules.moe.ExpertMLPs
neuronx_distributed.modules.moe.MoE
neuronx_distributed.modules.moe.RouterSinkhorn
neuronx_distributed.modules.moe.RouterTopK
neuronx_distributed.modules.moe.blockwise.ActivationFunction
neuronx_distributed.modules.moe.blockwise.BlockShardStrategy
neuronx_distributed.modules.moe.blockwise.BlockwiseMatmulArgs
neuronx_distributed.modules.moe.blockwise.ExpertAffinityScaleMode
neuronx_distributed.modules.moe.blockwise.LogicalNCConfig
neuronx_distributed.modules.moe.blockwise.SkipMode
neuronx_distributed.modules.moe.blockwise._call_bwmm_shard_on_block_kernel
neuronx_distributed.modules.moe.blockwise.can_use_blockwise_matmul_nki
neuronx_distributed.modules.moe.expert_mlps.ExpertMLPs
neuronx_distributed.modules.moe.expert_mlps_v2.ExpertMLPsV2
neuronx_distributed.modules.moe.expert_mlps_v2.can_use_find_index_kernel
neuronx_distributed.modules.moe.load_balancing_loss_func
neuronx_distributed.modules.moe.model_utils.DEFAULT_BLOCK_SIZE
neuronx_distributed.modules.moe.moe_config_validator.MoeConfigValidator
neuronx_distributed.modules.moe.moe_configs.BlockwiseMatmulConfig
neuronx_distributed.modules.moe.moe_configs.MoEFusedTKGConfig
neuronx_distributed.modules.moe.moe_configs.RoutedExpertsMLPOpsConfig
neuronx_distributed.modules.moe.moe_configs.RouterConfig
neuronx_distributed.modules.moe.moe_fused_tkg.MoEFusedTKG
neuronx_distributed.modules.moe.moe_fused_tkg._convert_torch_dtype_to_nki_dtype
neuronx_distributed.modules.moe.moe_fused_tkg_mx.MoEFusedTKGMX
neuronx_distributed.modules.moe.moe_parallel_layers.ExpertFusedColumnParallelLinear
neuronx_distributed.modules.moe.moe_parallel_layers.ExpertFusedRowParallelLinear
neuronx_distributed.modules.moe.routing.GroupLimitedRouter
neuronx_distributed.modules.moe.shared_experts.SharedExperts
neuronx_distributed.modules.moe.token_shuffling
neuronx_distributed.modules.qkv_linear.GQAQKVColumnParallelLinear
neuronx_distributed.modules.qkv_linear.GQAQKVLinearWithAsyncCommunication
neuronx_distributed.modules.qkv_linear_utils._qkvlinear_autograd_base_setup_bwd
neuronx_distributed.modules.qkv_linear_utils._qkvlinear_autograd_base_setup_fwd
neuronx_distributed.modules.qkv_linear_utils._qkvlinear_autograd_bwd_grad_reduce
neuronx_distributed.modules.qkv_linear_utils._qkvlinear_autograd_bwd_input_grad
neuronx_distributed.modules.qkv_linear_utils._qkvlinear_autograd_bwd_no_weight_grad
neuronx_distributed.optimizer.NeuronEPZero1Optimizer
neuronx_distributed.optimizer.NeuronZero1Optimizer
neuronx_distributed.optimizer.zero_dcp_utils._get_optim_pid_to_param_names
neuronx_distributed.optimizer.zero_dcp_utils._get_optim_pid_to_params
neuronx_distributed.optimizer.zero_dcp_utils._get_param_to_param_names
neuronx_distributed.optimizer.zero_dcp_utils._unwrap_optim_state_dict
neuronx_distributed.optimizer.zero_dcp_utils._wrap_optim_state_dict
neuronx_distributed.optimizer.zero_dcp_utils.get_dcp_aux_infos
neuronx_distributed.parallel_layers
neuronx_distributed.parallel_layers.ColumnParallelLinear
neuronx_distributed.parallel_layers.RowParallelLinear
neuronx_distributed.parallel_layers.checkpointing.load
neuronx_distributed.parallel_layers.layers.BaseParallelLinear
neuronx_distributed.parallel_layers.layers.ColumnParallelLinear
neuronx_distributed.parallel_layers.layers.LinearWithAsyncCommunication
neuronx_distributed.parallel_layers.layers.ParallelEmbedding
neuronx_distributed.parallel_layers.layers.RowParallelLinear
neuronx_distributed.parallel_layers.layers.SPMDRank
neuronx_distributed.parallel_layers.layers_utils._linear_autograd_base_setup_bwd
neuronx_distributed.parallel_layers.layers_utils._linear_autograd_base_setup_fwd
neuronx_distributed.parallel_layers.layers_utils._linear_autograd_bwd_grad_reduce
neuronx_distributed.parallel_layers.layers_utils._linear_autograd_bwd_input_grad
neuronx_distributed.parallel_layers.layers_utils._linear_autograd_bwd_no_weight_grad
neuronx_distributed.parallel_layers.loss_functions.parallel_cross_entropy
neuronx_distributed.parallel_layers.pad.generate_padding_mask
neuronx_distributed.parallel_layers.parallel_state
neuronx_distributed.parallel_layers.parallel_state.PG_Group_Logic
neuronx_distributed.parallel_layers.parallel_state.ParallelGroups
neuronx_distributed.parallel_layers.parallel_state.arrange_kv_groups
neuronx_distributed.parallel_layers.parallel_state.ascending_descending_ring_PG_group
neuronx_distributed.parallel_layers.parallel_state.ascending_ring_PG_group
neuronx_distributed.parallel_layers.parallel_state.get_data_parallel_rank
neuronx_distributed.parallel_layers.parallel_state.get_logic_chosen
neuronx_distributed.parallel_layers.parallel_state.get_pipeline_model_parallel_rank
neuronx_distributed.parallel_layers.parallel_state.get_zero1_sharding_groups
neuronx_distributed.parallel_layers.random
neuronx_distributed.parallel_layers.utils.cast_if_autocast_enabled
neuronx_distributed.parallel_layers.utils.indices_split_along_dim
neuronx_distributed.parallel_layers.utils.is_torch_version_greater_than_2
neuronx_distributed.parallel_layers.utils.verify_casted_dtype
neuronx_distributed.pipeline.manual_pipe_stage.PipelineStageModule
neuronx_distributed.pipeline.model.NxDPPModel
neuronx_distributed.pipeline.partition
neuronx_distributed.pipeline.partition.create_partitions
neuronx_distributed.pipeline.scheduler.BackwardPostprocessTask
neuronx_distributed.pipeline.scheduler.BackwardPreprocessTask
neuronx_distributed.pipeline.scheduler.BackwardStepTask
neuronx_distributed.pipeline.scheduler.ForwardPostprocessTask
neuronx_distributed.pipeline.scheduler.ForwardPreprocessTask
neuronx_distributed.pipeline.scheduler.ForwardStepTask
neuronx_distributed.pipeline.scheduler.InferenceSchedule
neuronx_distributed.pipeline.scheduler.ReduceGradsTask
neuronx_distributed.pipeline.scheduler.Train1F1BSchedule
neuronx_distributed.pipeline.scheduler.TrainSchedule
neuronx_distributed.pipeline.trace
neuronx_distributed.pipeline.trace.get_concrete_args
neuronx_distributed.quantization.dequantize.blockwise_scale_dequantize
neuronx_distributed.quantization.dequantize.direct_cast_dequantize
neuronx_distributed.quantization.dequantize.get_broadcastable_shapes_for_blockwise_scale_dequantize
neuronx_distributed.quantization.dequantize.scale_dequantize
neuronx_distributed.quantization.microscaling.transform_weights.FP4_VALUES
neuronx_distributed.quantization.microscaling.transform_weights.dequant_byte_4bit_tensor
neuronx_distributed.quantization.microscaling.transform_weights.get_mxfp4_tensor
neuronx_distributed.quantization.microscaling.transform_weights.get_mxfp4_tensor_from_uint16
neuronx_distributed.quantization.microscaling.transform_weights.get_mxfp8_tensor_from_uint32
neuronx_distributed.quantization.microscaling.transform_weights.pack_byte_4bit_tensor
neuronx_distributed.quantization.microscaling.transform_weights.pack_fp4_x4_uint16
neuronx_distributed.quantization.microscaling.transform_weights.split_byte_4bit_tensor
neuronx_distributed.quantization.microscaling.transform_weights.split_gate_up
neuronx_distributed.quantization.observer.PerChannelAbsMaxObserver
neuronx_distributed.quantization.quantization_config.DtypeBound
neuronx_distributed.quantization.quantization_config.QuantizationType
neuronx_distributed.quantization.quantization_config.QuantizedDtype
neuronx_distributed.quantization.quantization_config.ScaleDtype
neuronx_distributed.quantization.quantization_config.get_default_blockwise_custom_qconfig_dict
neuronx_distributed.quantization.quantization_config.get_default_custom_qconfig_dict
neuronx_distributed.quantization.quantization_config.get_default_expert_wise_per_channel_custom_qconfig_dict
neuronx_distributed.quantization.quantization_config.get_default_per_channel_custom_qconfig_dict
neuronx_distributed.quantization.quantization_layers.BaseQuantizeParallelLinear
neuronx_distributed.quantization.quantization_layers.QuantizedColumnParallel
neuronx_distributed.quantization.quantization_layers.QuantizedExpertFusedColumnParallel
neuronx_distributed.quantization.quantization_layers.QuantizedExpertFusedRowParallel
neuronx_distributed.quantization.quantization_layers.QuantizedParallelLinearLayerStateDictAdaptor
neuronx_distributed.quantization.quantization_layers.QuantizedRowParallel
neuronx_distributed.quantization.quantization_utils.extract_q_scale
neuronx_distributed.quantization.quantization_utils.quantize_fp8_per_channel
neuronx_distributed.quantization.quantization_utils.quantize_per_channel_symmetric
neuronx_distributed.quantization.quantization_utils.quantize_per_tensor_symmetric
neuronx_distributed.quantization.quantize.convert
neuronx_distributed.trace.hlo_utils
neuronx_distributed.trace.model_builder.BaseModelInstance
neuronx_distributed.trace.model_builder.ModelBuilder
neuronx_distributed.trace.model_builder._check_weight_name_regex
neuronx_distributed.trace.trace._mock_parallel_state
neuronx_distributed.trace.trace._validate_traceable
neuronx_distributed.trace.trace.shard_children
neuronx_distributed.trainer.PostPartitionHooks
neuronx_distributed.trainer.optimizer.NxDOptimizer
neuronx_distributed.utils.HloMetadataLevel
neuronx_distributed.utils.batch_utils.get_batch_on_this_context_parallel_rank
neuronx_distributed.utils.hardware
neuronx_distributed.utils.logger._rank0_only
neuronx_distributed.utils.logger.get_log_level
neuronx_distributed.utils.logger.get_logger
neuronx_distributed.utils.model_utils.check_delay_tracing
neuronx_distributed.utils.model_utils.get_delay_tracing
neuronx_distributed.utils.model_utils.get_platform_lnc
neuronx_distributed.utils.model_utils.move_model_to_device
neuronx_distributed.utils.random.set_random_seed
neuronx_distributed.utils.serialization.SerializationManager
neuronx_distributed.utils.serialization.TensorMeta
neuronx_distributed.utils.tensor_capture.disable_tensor_capture
neuronx_distributed.utils.tensor_capture.enable_tensor_capture
neuronx_distributed.utils.tensor_capture.get_available_modules
neuronx_distributed.utils.tensor_capture.get_captured_tensors_dict
neuronx_distributed.utils.tensor_capture.model_modification.find_available_modules
neuronx_distributed.utils.tensor_capture.model_modification.modify_model_for_tensor_capture
neuronx_distributed.utils.tensor_capture.model_modification.restore_model
neuronx_distributed.utils.tensor_capture.register_tensor
neuronx_distributed.utils.tensor_capture.registry.CapturedModelInfo
neuronx_distributed.utils.tensor_capture.registry.TensorRegistry
neuronx_distributed.utils.tensor_replacement.model_modification.modify_model_for_tensor_replacement
neuronx_distributed.utils.tensor_replacement.model_modification.patch_forward_with_additional_args
neuronx_distributed.utils.tensor_replacement.registry.RuntimeRegister
neuronx_distributed.utils.tensor_utils.cumsum
neuronx_distributed.utils.utils.get_dict_from_json
neuronx_distributed.utils.utils.hardware
""".split()


def _resolve(dotted: str) -> object:
    try:
        return importlib.import_module(dotted)
    except ModuleNotFoundError as err:
        if err.name != dotted:
            raise
    module, name = dotted.rsplit(".", 1)
    return getattr(importlib.import_module(module), name)


def test_every_name_nxd_unit_tests_import_resolves_or_says_why():
    from nxd_compat.surface import NotProvidedError

    refused = []
    for dotted in NXD_UNIT_TEST_NAMES:
        try:
            _resolve(dotted)
        except NotProvidedError as err:
            assert "nxd-compat" in str(err), (dotted, err)
            refused.append(dotted)
    print(f"\n{len(NXD_UNIT_TEST_NAMES)} names: {len(NXD_UNIT_TEST_NAMES) - len(refused)} resolve, "
          f"{len(refused)} raise NotProvidedError")


def test_cumsum_is_nxds():
    from neuronx_distributed.utils.tensor_utils import cumsum

    x = torch.randn(37, 5, dtype=torch.float32)
    # NxD's definition: summed in float64, cast back to the input's dtype
    assert torch.equal(cumsum(x, tril_size=8), torch.cumsum(x.double(), dim=0).float())
    with pytest.raises(ValueError, match="2D"):
        cumsum(x[0])
    with pytest.raises(NotImplementedError, match="dimension-0"):
        cumsum(x, dim=1)


def test_set_random_seed_reseeds_torch():
    from neuronx_distributed.utils.random import set_random_seed

    set_random_seed(3)
    first = torch.rand(4)
    set_random_seed(3)
    assert torch.equal(first, torch.rand(4))


def test_polar_rope_is_the_complex_rotation():
    from neuronx_distributed.modules.attention.utils import apply_rotary_polar_compatible, precompute_freqs_cis

    seq, heads, dim = 6, 2, 8
    freqs = precompute_freqs_cis(dim, seq)[None]  # [batch, seq, dim/2]: the positions of each batch row
    q, k = torch.randn(1, seq, heads, dim), torch.randn(1, seq, heads, dim)
    q_out, k_out = apply_rotary_polar_compatible(q, k, freqs)
    # the rotation of consecutive pairs (x0 + i x1) by position * theta^(-2j/dim), in float64
    pos = torch.arange(seq, dtype=torch.float64)[:, None]
    angles = pos * (10000.0 ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim))[None, :]
    rot = torch.polar(torch.ones_like(angles), angles)[None, :, None, :]
    expect = torch.view_as_real(torch.view_as_complex(q.double().reshape(1, seq, heads, dim // 2, 2)) * rot)
    torch.testing.assert_close(q_out.double(), expect.reshape(1, seq, heads, dim), rtol=1e-5, atol=1e-6)
    assert k_out.shape == k.shape
