"""The NNM / NeMo -> nxd config mapping, as data (docs/migration.md prints the same tables).

Each source key (dotted path in the NNM or NeMo YAML) is either moved to an nxd key, removed
because it has no effect in nxd (``REMOVED``: GPU fusions, fp16 loss scaling, always-on flags),
or supported only at its neutral value (``NEUTRAL``: any other value would change training and is
reported as unsupported). Keys in no table are reported as unsupported too — nothing is dropped
silently.
"""

from __future__ import annotations

from typing import Any

#: source dotted key -> nxd dotted key (the value is copied; a few get converted in convert.py)
MOVES: dict[str, str] = {
    # parallelism lived under ``model`` in NNM / NeMo
    "model.tensor_model_parallel_size": "distributed_strategy.tensor_model_parallel_size",
    "model.pipeline_model_parallel_size": "distributed_strategy.pipeline_model_parallel_size",
    "model.virtual_pipeline_model_parallel_size": "distributed_strategy.virtual_pipeline_model_parallel_size",
    "model.pipeline_model_parallel_split_rank": "distributed_strategy.pipeline_model_parallel_split_rank",
    "model.context_parallel_size": "distributed_strategy.context_parallel_size",
    "model.expert_model_parallel_size": "distributed_strategy.expert_model_parallel_size",
    "model.sequence_parallel": "distributed_strategy.sequence_parallel",
    "model.wrap_with_zero": "distributed_strategy.zero1",
    "model.kv_replicator": "distributed_strategy.kv_replicator",
    # data and the tokenizer moved out of ``model``
    "model.micro_batch_size": "data.micro_batch_size",
    "model.global_batch_size": "data.global_batch_size",
    "model.tokenizer": "data.tokenizer",
    "model.seed": "seed",
    "model.resume_from_checkpoint": "exp_manager.resume_from_checkpoint",
    "model.grad_allreduce_chunk_size_mb": "bucket_size_collectives",
    # NeMo spellings
    "model.num_query_groups": "model.num_kv_heads",
    "model.rotary_base": "model.rope_theta",
}

#: whole sections moved (every key below them keeps its name)
SECTION_MOVES: dict[str, str] = {"model.data": "data", "model.optim": "model.optim"}

#: source keys that mean nothing in nxd, whatever their value (the reason is printed)
REMOVED: dict[str, str] = {
    "trainer.logger": "nxd's experiment manager creates the loggers (exp_manager)",
    "trainer.enable_checkpointing": "checkpoints come from exp_manager.create_checkpoint_callback",
    "trainer.replace_sampler_ddp": "nxd's data modules shard by data-parallel rank themselves",
    "trainer.use_distributed_sampler": "nxd's data modules shard by data-parallel rank themselves",
    "trainer.benchmark": "cuDNN autotuning flag; no effect on nxd's layers",
    "trainer.enable_model_summary": "no model summary is printed",
    "trainer.enable_progress_bar": "kept by nxd as trainer.enable_progress_bar",
    "model.pre_process": "always on for decoder models (embedding lookup at the first stage)",
    "model.post_process": "always on for decoder models (LM head at the last stage)",
    "model.native_amp_init_scale": "fp16 loss scaling; nxd trains in fp32/bf16",
    "model.native_amp_growth_interval": "fp16 loss scaling; nxd trains in fp32/bf16",
    "model.hysteresis": "fp16 loss scaling; nxd trains in fp32/bf16",
    "model.apply_query_key_layer_scaling": "only changes fp16 numerics",
    "model.persist_layer_norm": "GPU kernel choice",
    "model.bias_activation_fusion": "GPU fusion (CUDA kernel); same numerics without it",
    "model.bias_dropout_add_fusion": "GPU fusion (CUDA kernel); same numerics without it",
    "model.masked_softmax_fusion": "GPU fusion (CUDA kernel); same numerics without it",
    "model.gradient_accumulation_fusion": "GPU fusion (CUDA kernel); same numerics without it",
    "model.grad_div_ar_fusion": "GPU fusion (CUDA kernel); same numerics without it",
    "model.onnx_safe": "export flag",
    "model.apex_transformer_log_level": "Apex is not used",
    "model.gradient_as_bucket_view": "DDP memory option; nxd reduces gradients in its optimizer",
    "model.sync_batch_comm": "p2p implementation detail",
    "model.mcore_gpt": "Megatron-core switch; nxd has one implementation",
    "model.nsys_profile": "use torch.profiler",
    "model.precision": "read from trainer.precision",
    "model.encoder_seq_length_divisible_by": "no effect",
    "model.use_emha": "Neuron-specific attention kernel switch",
    "model.optim.bucket_cap_mb": "use bucket_size_collectives",
    "model.optim.overlap_grad_sync": "scheduling detail of NeMo's distributed optimizer",
    "model.optim.overlap_param_sync": "scheduling detail of NeMo's distributed optimizer",
    "model.optim.contiguous_grad_buffer": "memory layout detail of NeMo's distributed optimizer",
    "model.optim.contiguous_param_buffer": "memory layout detail of NeMo's distributed optimizer",
    "model.optim.grad_sync_dtype": "nxd reduces gradients in fp32",
    "model.data.data_impl": "nxd reads Megatron mmap (.bin/.idx) datasets, the only format NNM wrote",
    "model.data.skip_warmup": "no index warm-up pass in nxd",
    "model.data.num_workers": "nxd's indexed dataset is memory-mapped and read in-process",
    "model.data.validation_drop_last": "validation always uses whole micro-batches",
    "model.data.no_seqlen_plus_one_input_tokens": "nxd's samples are seq_length+1 tokens, as NNM's default",
    "model.data.pad_samples_to_global_batch_size": "training batches are always full",
    "exp_manager.checkpoint_callback_params.always_save_nemo": "no .nemo archives; checkpoints are nxd checkpoints",
    "exp_manager.checkpoint_callback_params.save_best_model": "retention is save_top_k by step",
}

#: source keys supported only at a neutral value (None means "null/absent is neutral")
NEUTRAL: dict[str, tuple[tuple[Any, ...], str]] = {
    "trainer.accumulate_grad_batches": ((1, None), "gradient accumulation = global_batch_size / (micro_batch_size x DP)"),
    "trainer.strategy": ((None,), "the strategy comes from distributed_strategy"),
    "trainer.plugins": ((None,), "no Lightning plugins in the YAML trainer"),
    "restore_from_path": ((None,), ".nemo archives are not read; convert the checkpoint (nxd ckpt convert --from nnm)"),
    "model.megatron_amp_O2": ((False, None), "O2 mixed precision is not supported; use precision.type"),
    "model.fp32_residual_connection": ((False, None), "not supported (GPU mixed precision)"),
    "model.fp16_lm_cross_entropy": ((False, None), "not supported (fp16)"),
    "model.transformer_engine": ((False, None), "Transformer Engine is CUDA-only"),
    "model.fp8": ((False, None), "fp8 training is not supported"),
    "model.has_bias": ((False, None), "nxd's Llama has no linear biases"),
    "model.transformer_block_type": (("pre_ln", None), "only pre-LayerNorm blocks (Llama) are implemented"),
    "model.rotary_percentage": ((1, 1.0, None), "partial rotary embeddings are not implemented"),
    "model.use_scaled_init_method": ((False, None), "nxd's Llama initialises every linear with init_method_std "
                                     "(irrelevant when continuing from a converted checkpoint)"),
    "model.activations_checkpoint_method": ((None, "uniform"), "only full (per layer) or selective recompute; "
                                            "'uniform' with num_layers 1 is the same as full"),
    "model.activations_checkpoint_num_layers": ((None, 1), "full recompute works on every layer boundary"),
    "model.num_micro_batches_with_partial_activation_checkpoints": ((None,), "not supported by NxD Training either"),
    "model.activations_checkpoint_layers_per_pipeline": ((None,), "not supported by NxD Training either"),
    "model.disable_layer_norm_checkpointing": ((None, False, True), "layer norms follow the layer's recompute"),
    "model.data.dataloader_type": (("single", None), "only the 'single' (sequential) Megatron sampler"),
    "model.data.index_mapping_dir": ((None,), "nxd caches sample indices next to the dataset"),
    "model.optim.sched.warmup_ratio": ((None,), "give warmup_steps"),
    "model.optim.sched.decay_steps": ((None,), "use max_steps"),
}

#: trainer keys that keep their name and place
SAME_PLACE_SECTIONS = ("trainer", "exp_manager")

#: NNM / NeMo optimizer names -> nxd's (and whether it implies ZeRO-1)
OPTIMIZER_NAMES: dict[str, tuple[str, bool]] = {
    "adamw": ("adamw", False), "adam": ("adam", False), "fused_adam": ("adamw", False),
    "distributed_fused_adam": ("adamw", True), "adamw_fp32OptState": ("adamw_fp32OptState", False),
    "sgd": ("sgd", False), "adagrad": ("adagrad", False), "rmsprop": ("rmsprop", False),
    "adamax": ("adamax", False), "adadelta": ("adadelta", False),
}

#: ``trainer.precision`` -> ``precision.type``
PRECISION: dict[str, str] = {
    "32": "fp32", "32-true": "fp32", "bf16": "mixed_precision", "bf16-mixed": "autocast", "bf16-true": "bf16SR",
}
