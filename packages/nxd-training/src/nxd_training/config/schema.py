"""The YAML schema: NxD Training's sections as typed pydantic models (unknown keys are errors).

Key names follow NxDT's ``examples/conf/*.yaml`` so an NxDT config loads unchanged; the few nxd
additions (``data.module``, ``model.architecture``, ``launcher``, ``generation``,
``distributed_strategy.collective_timeout``, ``distributed_strategy.heartbeat_timeout``,
``distributed_strategy.fsdp``) are documented
in docs/config.md. Settings NxDT passed through environment variables are plain keys here.
"""

from __future__ import annotations

from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator

from nxd_training.config.nxdt.precision import PRECISION_TYPES


class Section(BaseModel):
    """Base of every section: unknown keys are rejected, values are not silently coerced."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, protected_namespaces=(), populate_by_name=True)


# --------------------------------------------------------------------------- trainer
class ProfileConfig(Section):
    """``trainer.profile`` (an nxd addition): a torch.profiler trace of steps start_step..start_step+num_steps-1."""

    start_step: int = Field(..., ge=1, description="first profiled step (1-based, counted from the run's start)")
    num_steps: int = Field(1, ge=1)
    dir: Union[str, None] = Field(None, description="trace folder; default <log_dir>/profile")
    record_shapes: bool = False
    profile_memory: bool = False
    with_stack: bool = False


class TrainerConfig(Section):
    devices: int = Field(1, ge=1, description="ranks per node")
    num_nodes: int = Field(1, ge=1)
    accelerator: Literal["auto", "cpu", "cuda", "accelerator", "xla"] = "auto"
    max_steps: int = Field(-1, ge=-1, description="-1: bounded by max_epochs")
    max_epochs: int = Field(-1, ge=-1, description="-1: bounded by max_steps")
    max_time: Union[str, float, None] = Field(None, description="seconds, or DD:HH:MM:SS")
    log_every_n_steps: int = Field(1, ge=1)
    val_check_interval: Union[int, float] = Field(0, ge=0, description="validate every N steps; 0 disables")
    check_val_every_n_epoch: Union[int, None] = None
    num_sanity_val_steps: int = Field(0, ge=0)
    limit_val_batches: Union[int, float] = Field(1.0, ge=0)
    limit_test_batches: Union[int, float] = Field(0.0, ge=0)
    gradient_clip_val: Union[float, None] = Field(1.0, ge=0, description="0 or null disables clipping")
    lnc: Union[int, None] = Field(None, ge=1, le=2)
    vnc: Union[int, None] = Field(None, ge=1, le=2, description="NxDT's earlier name of lnc (config/nxdt/history.py)")
    sequential_move_factor: int = Field(11, ge=1, le=32)
    enable_progress_bar: bool = True
    compile: Union[bool, dict[str, Any]] = Field(
        False, description="torch.compile each transformer block: true, or backend/mode/fullgraph/dynamic (nxd addition)")
    profile: Union[ProfileConfig, None] = None


# --------------------------------------------------------------------------- exp_manager
class CheckpointCallbackParams(Section):
    monitor: str = "step"
    save_top_k: int = Field(1, ge=-1, description="checkpoints kept; -1 keeps all")
    mode: Literal["max", "min"] = "max"
    save_last: bool = False
    filename: str = "{name}--step={step}-consumed_samples={consumed_samples}"
    model_parallel_size: Union[int, str, None] = None
    every_n_train_steps: Union[int, None] = Field(None, ge=1)
    every_n_epochs: Union[int, None] = Field(None, ge=0)
    train_time_interval: Union[float, None] = Field(None, gt=0)
    save_on_train_epoch_end: bool = False
    save_on_train_end: bool = True
    save_nemo_on_train_end: bool = False
    enable_version_counter: bool = True
    use_master_weights_in_ckpt: bool = False
    dirpath: Union[str, None] = None
    prefix: Union[str, None] = None


class ExpManagerConfig(Section):
    exp_dir: Union[str, None] = None
    name: Union[str, None] = None
    version: Union[str, int, None] = None
    explicit_log_dir: Union[str, None] = None
    use_datetime_version: bool = False
    log_local_rank_0_only: bool = True
    log_global_rank_0_only: bool = True
    create_tensorboard_logger: bool = True
    create_wandb_logger: bool = False
    create_mlflow_logger: bool = False
    summary_writer_kwargs: dict[str, Any] = Field(default_factory=dict)
    metrics_file: str = "metrics.jsonl"
    resume_if_exists: bool = False
    resume_ignore_no_checkpoint: bool = True
    resume_past_end: bool = False
    resume_from_checkpoint: Union[str, None] = None
    create_checkpoint_callback: bool = True
    checkpoint_callback_params: CheckpointCallbackParams = Field(default_factory=CheckpointCallbackParams)
    log_parameter_norm: bool = False
    log_gradient_norm: bool = True
    log_step_timing: bool = True
    enable_recovery_time_instrumentation: bool = False
    save_xser: bool = False
    load_xser: bool = False
    save_bf16: bool = False
    async_checkpointing: bool = False
    checkpoint_format: str = "torch"
    ckpt_ptl_version: Union[str, None] = None
    peak_tflops_per_device: Union[float, None] = Field(None, gt=0, description="for MFU; null: backend default")
    disable_validation_on_resume: bool = False
    files_to_copy: list[str] = Field(default_factory=list)


# --------------------------------------------------------------------------- distributed_strategy
class DistributedStrategyConfig(Section):
    tensor_model_parallel_size: int = Field(1, ge=1)
    pipeline_model_parallel_size: int = Field(1, ge=1)
    virtual_pipeline_model_parallel_size: Union[int, None] = Field(1, ge=1)
    pipeline_model_parallel_split_rank: Union[int, None] = None
    pipeline_schedule: Union[str, None] = None
    context_parallel_size: int = Field(1, ge=1)
    expert_model_parallel_size: int = Field(1, ge=1)
    token_shuffle_group_size: int = Field(1, ge=1)
    sequence_parallel: bool = False
    zero1: bool = False
    #: an nxd addition (NxDT has no FSDP): FSDP2 through nxd-fsdp, true or its settings (docs/fsdp.md)
    fsdp: Union[bool, dict[str, Any]] = Field(
        False, description="FSDP2 (pip install nxd-fsdp): true, or a mapping of reshard_after_forward, "
                           "replicate_degree (HSDP), cpu_offload, mixed_precision {param_dtype, reduce_dtype}")
    kv_replicator: Union[int, None] = Field(None, ge=1)
    #: an nxd addition (NxDT has no such key): how long a rank waits in one collective before failing
    collective_timeout: float = Field(
        1800.0, gt=0, le=7 * 24 * 3600,
        description="seconds a collective may wait for the other ranks on the default group and every "
                    "TP/DP/PP/CP/EP group before the waiting rank fails (torch's default: 1800)")
    #: an nxd addition: how long `nxd train` waits for a rank that stopped, by its heartbeat (docs/cluster.md)
    heartbeat_timeout: Union[float, None] = Field(
        300.0, gt=0, le=7 * 24 * 3600,
        description="seconds after which nxd train names a rank whose process sent no heartbeat (stopped, frozen), "
                    "or, once a step completed, ranks that completed no step (bound: at least 10 x the longest "
                    "step), and stops the job; null: off")


# --------------------------------------------------------------------------- data
class TokenizerConfig(Section):
    library: Union[str, None] = None
    type: Union[str, None] = None
    model: Union[str, None] = None
    vocab_file: Union[str, None] = None
    merge_file: Union[str, None] = None
    delimiter: Union[str, None] = None
    sentencepiece_legacy: bool = False
    use_fast: bool = True


class DataConfig(Section):
    """Common keys are typed here; the rest belongs to the selected data module, whose
    ``validate(config)`` checks it before launch."""

    model_config = ConfigDict(extra="allow", validate_assignment=True, protected_namespaces=())

    module: Union[str, None] = Field(None, description="data module name; null: chosen from model_source")
    micro_batch_size: int = Field(1, ge=1)
    global_batch_size: int = Field(1, ge=1)
    seq_length: Union[int, None] = Field(None, ge=1)
    tokenizer: Union[str, TokenizerConfig, None] = Field(None, description="tokenizer path, or NxDT's section (type = path)")
    prepare: Union[Literal["quickstart"], None] = Field(None, description="build the embedded corpus before launch")
    prepare_dir: Union[str, None] = Field(None, description="cache folder for data.prepare (default ~/.cache/nxd)")


# --------------------------------------------------------------------------- model
class SchedConfig(Section):
    name: str = "constant"
    warmup_steps: int = Field(0, ge=0)
    max_steps: Union[int, None] = Field(None, ge=1, description="null: trainer.max_steps")
    min_lr: float = Field(0.0, ge=0)
    constant_steps: int = Field(0, ge=0)


class OptimConfig(Section):
    name: str = "adamw"
    lr: float = Field(1e-4, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = Field(1e-8, gt=0)
    momentum: float = Field(0.0, ge=0)
    capturable: bool = False
    sched: SchedConfig = Field(default_factory=SchedConfig)


class FusionsConfig(Section):
    softmax: bool = False
    flash_attention: bool = False
    ring_attention: bool = False


class MoEConfig(Section):
    model_config = ConfigDict(extra="allow", protected_namespaces=())
    num_experts: int = Field(1, ge=1)


class ModelConfig(Section):
    architecture: Union[str, None] = Field(
        None, description="registered model name (nxd.get_model); null: chosen as NxD Training chooses its model "
                          "class (config/features.py), and the resolved config names the choice")
    preset: Union[str, None] = Field(None, description="a preset of the model plugin, e.g. llama3-8b")
    # NxDT calls this key ``model_config``, a name pydantic reserves: stored as hf_config.
    hf_config: Union[str, dict[str, Any], None] = Field(None, alias="model_config", description="HF config.json path or dict")
    encoder_seq_length: Union[int, None] = Field(None, ge=1)
    max_position_embeddings: Union[int, None] = Field(None, ge=1)
    num_layers: Union[int, None] = Field(None, ge=1)
    hidden_size: Union[int, None] = Field(None, ge=1)
    ffn_hidden_size: Union[int, None] = Field(None, ge=1)
    num_attention_heads: Union[int, None] = Field(None, ge=1)
    num_kv_heads: Union[int, None] = Field(None, ge=1)
    kv_channels: Union[int, None] = Field(None, ge=1)
    vocab_size: Union[int, None] = Field(None, ge=1)
    rope_theta: Union[float, None] = Field(None, gt=0)
    layernorm_epsilon: Union[float, None] = Field(None, gt=0)
    share_embeddings_and_output_weights: Union[bool, None] = None
    init_method_std: Union[float, None] = Field(None, gt=0)
    qkv_linear: bool = True
    fuse_qkv: bool = True
    transpose_nki_inputs: bool = True
    pipeline_cuts: Union[list[str], None] = None
    use_cpu_initialization: bool = True
    weight_init_only: bool = False
    meta_device_init: bool = Field(
        False, description="nxd addition: build the model on the meta device, then materialise it with each "
                           "module's reset_parameters(); with distributed_strategy.fsdp each rank allocates and "
                           "initialises only its own shards. The initial weights are the same as without it")
    pretrained_checkpoint: Union[str, None] = Field(
        None, description="nxd addition: a Hugging Face model folder (config.json + *.safetensors) whose weights "
                          "initialise the run (the optimizer starts fresh); its config.json is the model_config")
    activations_checkpoint_granularity: Union[Literal["selective", "full", "op"], None] = None  # op: nxd addition
    activations_checkpoint_recompute: Union[list[str], None] = None
    activations_checkpoint_recompute_mlp: Union[bool, None] = Field(
        None, description="NxDT 2.20's key, replaced by activations_checkpoint_recompute (config/nxdt/history.py)")
    fusions: FusionsConfig = Field(default_factory=FusionsConfig)
    fused_kernels: Union[list[str], None] = Field(
        None, description="nxd addition: ops run by fused GPU kernels (Liger-Kernel, CUDA): rms_norm, swiglu, rope, "
                          "cross_entropy (fused linear + cross-entropy; TP=1)")
    do_layer_norm_weight_decay: bool = False
    # Keys that change the model. null (the default) means "the selected model's own default" (as
    # NxDT's model classes do, e.g. Megatron GPT's biases and scaled init); a value is honoured only
    # by a model plugin that implements the key (config/features.py), else refused. Defaults are
    # null rather than Llama's values so that a written-out config means the same when read again.
    hidden_dropout: Union[float, None] = Field(None, ge=0, le=1)
    attention_dropout: Union[float, None] = Field(None, ge=0, le=1)
    ffn_dropout: Union[float, None] = Field(None, ge=0, le=1)
    normalization: Union[Literal["rmsnorm", "layernorm"], None] = None
    activation: Union[Literal["swiglu", "gelu", "geglu", "reglu", "squared-relu", "fast-geglu", "fast-swiglu",
                              "fast-reglu", "silu", "relu"], None] = None
    position_embedding_type: Union[Literal["rope", "learned_absolute"], None] = None
    rotary_percentage: Union[float, None] = Field(None, gt=0, le=1)
    transformer_block_type: Union[Literal["pre_ln", "post_ln", "normformer", "gpt_j"], None] = None
    has_bias: Union[bool, None] = None
    use_scaled_init_method: Union[bool, None] = None
    sliding_window: Union[int, None] = Field(None, ge=1)
    sliding_window_size: Union[int, None] = Field(None, ge=1)
    # Numerically neutral in Megatron (Q.K^T scaled by 1/layer and the softmax by layer again) and a
    # fused-kernel choice: accepted, no effect on the result.
    apply_query_key_layer_scaling: Union[bool, None] = None
    persist_layer_norm: bool = False
    make_vocab_size_divisible_by: Union[int, None] = Field(None, ge=1)
    moe: Union[MoEConfig, None] = None
    optim: OptimConfig = Field(default_factory=OptimConfig)


# --------------------------------------------------------------------------- precision
class PrecisionConfig(Section):
    type: Literal[PRECISION_TYPES] = "fp32"  # type: ignore[valid-type]
    master_weights: Union[bool, None] = None
    fp32_grad_acc: Union[bool, None] = None
    xla_use_bf16: Union[bool, int, None] = None
    xla_downcast_bf16: Union[bool, int, None] = None
    neuron_rt_stochastic_rounding_en: Union[bool, int, None] = None
    fp32_grads_cc: bool = False
    # unset: NxDT's default for the type (precision.parallel_layers_reduce_dtype)
    parallel_layers_reduce_dtype: Union[Literal["bf16", "fp32"], None] = None
    # nxd addition: with type fp8, nxd-fp8's options (recipe: tensorwise|rowwise|rowwise_with_gw_hp,
    # skip_modules, emulate), validated by nxd-fp8 (docs/fp8.md)
    fp8: Union[dict[str, Any], None] = None

    @field_validator("parallel_layers_reduce_dtype", mode="before")
    @classmethod
    def _nxdt_lower_cases(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value  # NxDT's get_dtype: FP32 is fp32


# --------------------------------------------------------------------------- model_alignment_strategy
class SFTConfig(Section):
    packing: bool = True


class ModelAlignmentConfig(Section):
    sft: Union[SFTConfig, None] = None
    #: NxD's LoraConfig fields with NxDT's defaults (nxd_training.config.nxdt.peft; docs/config.md)
    peft: Union[dict[str, Any], None] = None
    dpo: Union[dict[str, Any], None] = None
    orpo: Union[dict[str, Any], None] = None


# --------------------------------------------------------------------------- nxd additions
class LauncherConfig(Section):
    """How ``nxd train`` starts ranks through torchrun (multi-node: one command per node)."""

    rdzv_backend: str = "c10d"
    rdzv_endpoint: Union[str, None] = Field(None, description="host:port of the rendezvous; null: standalone")
    rdzv_id: Union[str, None] = None
    node_rank: Union[int, None] = Field(None, ge=0)
    # multi-node runs only (docs/cluster.md): every node's launcher gives up within these bounds
    rdzv_join_timeout: int = Field(300, ge=1, description="seconds every node waits for all nodes to join; "
                                   "then it exits naming the nodes that did not (torchrun's join_timeout)")
    rdzv_last_call_timeout: int = Field(5, ge=1, description="seconds to wait for more nodes once the minimum joined "
                                        "(elastic ranges only; torchrun's last_call_timeout)")
    rdzv_read_timeout: int = Field(30, ge=1, description="seconds a rendezvous store read may take before the node "
                                   "hosting it counts as gone (torchrun's read_timeout)")
    max_restarts: int = Field(0, ge=0)
    monitor_interval: float = Field(1.0, gt=0)
    nproc_per_node: Union[int, None] = Field(None, ge=1, description="null: trainer.devices")
    extra_args: list[str] = Field(default_factory=list)


class GenerationConfig(Section):
    """Samples printed at the end of training (greedy unless do_sample)."""

    prompts: list[str] = Field(default_factory=list)
    max_new_tokens: int = Field(32, ge=1)
    do_sample: bool = False
    temperature: float = Field(1.0, gt=0)
    top_k: Union[int, None] = Field(None, ge=1)


class TrainingConfig(Section):
    """The NxDT YAML as the user writes it. Once ``nxd train`` has resolved it
    (:func:`nxd_training.config.resolve_config`), it carries the run's one
    :class:`nxd.run_config.RunConfig` (:attr:`run`): what every step after resolution reads."""

    #: the RunConfig resolution made (or a rank read back from config.yaml); None: not resolved
    _run: Any = PrivateAttr(None)
    name: str = "nxd_run"
    model_source: Literal["hf", "megatron"] = "hf"
    seed: int = Field(1234, ge=0)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    exp_manager: ExpManagerConfig = Field(default_factory=ExpManagerConfig)
    distributed_strategy: DistributedStrategyConfig = Field(default_factory=DistributedStrategyConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    precision: PrecisionConfig = Field(default_factory=PrecisionConfig)
    model_alignment_strategy: Union[ModelAlignmentConfig, None] = None
    launcher: LauncherConfig = Field(default_factory=LauncherConfig)
    generation: Union[GenerationConfig, None] = None
    # NxDT passed these to the Neuron runtime/compiler through environment variables.
    compiler_flags: Union[str, None] = None
    compiler_cache_url: Union[str, None] = None
    aync_exec_max_inflight_requests: Union[int, None] = Field(None, ge=1)
    bucket_size_collectives: Union[int, None] = Field(None, ge=1)
    neuron_rt_exec_timeout: Union[int, None] = Field(None, ge=1)
    neuron_experimental_compress_rg: bool = False

    @property
    def resolved(self) -> bool:
        """Resolved once by ``nxd train`` (or read back from a run's config.yaml): :attr:`run` is set."""
        return self._run is not None

    @property
    def run(self) -> Any:
        """The run's :class:`nxd.run_config.RunConfig` (``run.derived``: the model, the batch numbers,
        the data section, the workflow); a config not resolved yet has none."""
        if self._run is None:
            from nxd import ConfigError

            raise ConfigError("this config is not resolved: nxd_training.config.resolve_config(config) resolves it")
        return self._run

    def with_run(self, run: Any) -> TrainingConfig:
        """A copy carrying ``run`` (what resolution and ``load_resolved`` make)."""
        copy = self.model_copy()
        copy._run = run
        return copy
