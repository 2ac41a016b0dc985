"""Cross-field rules and derived values: everything checked before a rank starts.

``resolve_config(config)`` either returns the config carrying its one :class:`nxd.run_config.RunConfig`
(``run.derived``: world size, DP size, gradient accumulation, the model config, the data section;
each computed once here) or raises one :class:`nxd.ConfigError` naming the keys involved.

Workflows: a key under ``model_alignment_strategy`` other than ``sft`` and ``peft`` names a workflow that a
plugin registers through ``nxd_register_workflows`` (nxd-alignment provides ``dpo`` and ``orpo``).
The trainer only calls the :class:`nxd.specs.Workflow` contract: ``prepare`` once, ``loss`` per
micro-batch; plain pretraining and SFT need no workflow.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import nxd
from nxd import ComponentNotFound, ConfigError
from nxd.parallel import check_divisible
from nxd.paths import check_name, name_problem
from nxd.run_config import Derived, pipeline_schedule
from nxd_tensor_parallel.layout_rules import SizeNames, check_vocab, context_chunks, head_layout, sequence_shard
from nxd_training.config.features import check_features, hf_config_file, model_spec, recompute_classes, value_at
from nxd_training.config.nxdt import MODEL_KEY_MAP, key_notes, lora_config, run_config
from nxd_training.config.nxdt.precision import check_precision
from nxd_training.config.schema import (
    DataConfig,
    DistributedStrategyConfig,
    ExpManagerConfig,
    ModelAlignmentConfig,
    ModelConfig,
    OptimConfig,
    TokenizerConfig,
    TrainerConfig,
    TrainingConfig,
)
from nxd_training.optimizers import OPTIMIZERS
from nxd_training.schedules import SCHEDULES, schedule_names

#: keys of model_alignment_strategy the trainer handles itself
BUILTIN_KEYS = ("sft", "peft")


def build_workflow(align: ModelAlignmentConfig | None) -> tuple[str | None, Any]:
    """(the registered workflow ``model_alignment_strategy`` names, its object), or ``(None, None)``
    for plain pretraining or SFT; a missing plugin or a bad option is a :class:`nxd.ConfigError`
    naming the key (and what to install)."""
    names = [k for k in align.model_dump(exclude_none=True) if k not in BUILTIN_KEYS] if align is not None else []
    if len(names) > 1:
        raise ConfigError(f"model_alignment_strategy: choose one workflow, got {', '.join(names)}")
    if names and align.sft is not None:
        raise ConfigError(f"model_alignment_strategy: sft and {names[0]} are different workflows; set one of them")
    if not names:
        return None, None
    name = names[0]
    key = f"model_alignment_strategy.{name}"
    try:
        factory = nxd.get_workflow(name, need=key)
    except ComponentNotFound as exc:
        raise ConfigError(str(exc)) from None
    options = getattr(align, name, None)
    try:
        return name, factory(dict(options or {}))
    except ConfigError:
        raise
    except (TypeError, ValueError, KeyError) as exc:
        raise ConfigError(f"{key}: the {name} workflow rejected its options: {exc}") from None


def _sizes(ds: DistributedStrategyConfig, tr: TrainerConfig, data: DataConfig,
           model: ModelConfig) -> tuple[int, int, int, int, int, int]:
    """(world, tp, pp, dp, micro-batches per step, training sequence length). The sequence is
    ``data.seq_length`` (what the data module cuts), which NxDT's SFT/DPO configs set below the
    model's ``encoder_seq_length``; longer would exceed the model."""
    world = tr.devices * tr.num_nodes
    tp, pp, cp = ds.tensor_model_parallel_size, ds.pipeline_model_parallel_size, ds.context_parallel_size
    sizes = {"tensor_model_parallel_size": tp, "pipeline_model_parallel_size": pp}
    if cp > 1:
        sizes["context_parallel_size"] = cp
    try:
        dp = check_divisible(world, **sizes)
    except ValueError as err:
        raise ConfigError(f"trainer.devices={tr.devices} x trainer.num_nodes={tr.num_nodes}: {err}") from None
    vpp = ds.virtual_pipeline_model_parallel_size or 1
    if vpp > 1 and pp == 1:
        raise ConfigError("distributed_strategy.virtual_pipeline_model_parallel_size > 1 needs pipeline_model_parallel_size > 1")
    per_step = data.micro_batch_size * dp
    if data.global_batch_size % per_step:
        raise ConfigError(
            f"data.global_batch_size={data.global_batch_size} must be a multiple of data.micro_batch_size x DP = "
            f"{data.micro_batch_size} x {dp} = {per_step} (global batch = micro batch x DP x gradient accumulation)"
        )
    data_len, model_len = data.seq_length, model.encoder_seq_length
    if data_len is not None and model_len is not None and data_len > model_len:
        raise ConfigError(f"data.seq_length={data_len} exceeds model.encoder_seq_length={model_len} (the longest "
                          "sequence the model is configured for); lower data.seq_length or raise encoder_seq_length")
    seq = data_len or model_len
    if seq is None:
        raise ConfigError("data.seq_length (or model.encoder_seq_length) is required")
    return world, tp, pp, dp, data.global_batch_size // per_step, seq


def model_dict(m: ModelConfig, data: DataConfig, spec: Any, hf: dict[str, Any] | None,
               covered: dict[str, str]) -> dict[str, Any]:
    """The model config as Hugging Face keys: preset, then the ``model_config`` file ``hf`` (less its
    ``covered`` feature keys: :func:`check_features`), then keys; the feature keys the model
    implements (``spec.implements``) are passed under their NxDT names."""
    result: dict[str, Any] = {}
    if m.preset is not None:
        presets = dict(getattr(spec, "presets", {}) or {})
        if m.preset not in presets:
            from nxd_training.config.errors import suggest

            raise ConfigError(f"model.preset: unknown preset {m.preset!r}{suggest(m.preset, list(presets))}; "
                              f"available: {', '.join(sorted(presets)) or 'none'}")
        result.update(presets[m.preset])
    result.update({k: v for k, v in (hf or {}).items() if k not in covered})
    for ours, theirs in MODEL_KEY_MAP.items():
        value = getattr(m, ours)
        if value is not None:
            result[theirs] = value
    if "vocab_size" not in result and not m.preset:
        vocab = _tokenizer_vocab(data)
        if vocab is not None:
            result["vocab_size"] = vocab  # NxDT's Megatron models take the vocabulary from the tokenizer
    for key in sorted(getattr(spec, "implements", ()) or ()):
        # a model key left null means the model's own default (as NxDT's model classes do): not passed
        value = value_at(m, key[len("model."):]) if key.startswith("model.") else None
        if value is not None:
            result[key[len("model."):]] = value
    return result


def _tokenizer_vocab(data: DataConfig) -> int | None:
    from nxd_data.tokenizers import load_tokenizer

    files = file_tokenizer(data)
    if files is not None:
        return int(load_tokenizer(files).vocab_size)  # refuses naming the key of a missing file
    path = tokenizer_path(data)
    if path is None or not Path(path).exists():
        return None
    try:
        return int(load_tokenizer(path).vocab_size)
    except (ConfigError, OSError, ValueError) as exc:
        raise ConfigError(f"data.tokenizer: cannot read {path!r} to size the model's vocabulary: {exc}") from None


#: the model keys that give a model its size; a config setting none of them (and no source below) names no model
SIZE_KEYS = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads")


def _require_model_source(m: ModelConfig, spec: Any, hf: dict[str, Any] | None) -> None:
    """A config must say which model it trains: a preset, a config.json (``model_config`` or the folder of
    ``pretrained_checkpoint``) or the size keys. With none left (a run's config.yaml whose
    ``pretrained_checkpoint`` was set to null) the plugin's default size would be built silently."""
    if m.preset is not None or hf is not None or any(getattr(m, key) is not None for key in SIZE_KEYS):
        return
    presets = ", ".join(sorted(getattr(spec, "presets", None) or {})) or "none"
    raise ConfigError(
        f"model: no model source is set, so the {spec.name!r} plugin would build its default size: set "
        "model.pretrained_checkpoint (a Hugging Face folder), model.model_config (a config.json), "
        f"model.preset ({presets}; a preset is how to ask for a published size), or the size keys "
        f"{', '.join('model.' + k for k in SIZE_KEYS)}")


def _model(config: TrainingConfig) -> tuple[Any, dict[str, Any], Any, str, list[str], Any]:
    """(spec, model dict, model config, why this model, notes on config.json keys it does not take,
    the activation-checkpoint classes)."""
    hf = hf_config_file(config.model)
    spec, reason = model_spec(config.model, config.model_source, config.name, hf)
    _require_model_source(config.model, spec, hf)
    if hf and (getattr(spec, "extras", None) or {}).get("sizes_from_hf_config"):
        _yaml_agrees_with_hf(config.model, hf)
    # the training sequence (checked with the batch sizes later: the model is refused first)
    covered = check_features(config, spec, hf, config.data.seq_length or config.model.encoder_seq_length)
    recompute = recompute_classes(config.model, spec)
    as_dict = model_dict(config.model, config.data, spec, hf, covered)
    try:
        model_config = spec.config_from_dict(dict(as_dict))
    except ConfigError as exc:
        raise ConfigError(f"model: {exc}") from None
    except (TypeError, ValueError, KeyError) as exc:
        raise ConfigError(f"model: the {spec.name} plugin rejected the model config: {exc}") from None
    return spec, as_dict, model_config, reason, list(covered.values()), recompute


def _yaml_agrees_with_hf(m: ModelConfig, hf: dict[str, Any]) -> None:
    """For a model whose sizes are its config.json's (the transformers family): a YAML size key
    naming another value is refused, never applied over the file."""
    for ours, theirs in MODEL_KEY_MAP.items():
        value = getattr(m, ours)
        if value is not None and theirs in hf and hf[theirs] != value:
            raise ConfigError(f"model.{ours}={value} disagrees with the model's config.json ({theirs}={hf[theirs]}); "
                              "this model's sizes are its config.json's: remove the key or set it to the file's value")


def _layout_fits_model(ds: DistributedStrategyConfig, spec: Any, model_config: Any, seq: int, tp: int, pp: int) -> None:
    """The parallel layout fits the model: heads (and K/V heads, replicated or not) split over TP,
    the sequence over SP and CP (CP needs a model whose attention spans CP ranks, and a sequence
    that cuts into 2 x CP chunks), the vocabulary over TP, PP only for a model with the pipeline
    contract (docs/pipeline.md)."""
    cp = ds.context_parallel_size
    check = (getattr(spec, "extras", None) or {}).get("check_layout")
    if callable(check):  # the model's own judgement, the one its build on every rank makes again
        check(model_config, tp=tp, pp=pp, cp=cp, sequence_parallel=bool(ds.sequence_parallel))
    if cp > 1 and not getattr(spec, "context_parallel", False):
        raise ConfigError(
            f"distributed_strategy.context_parallel_size={cp}: model.architecture {spec.name!r} does not support "
            "context parallelism (its parallel plan names no context_parallel attention modules, whose core the "
            "context_parallel transform swaps for ring attention across CP ranks); use context_parallel_size=1 or "
            "a model that declares them (llama, qwen3, qwen3_moe, deepseek_v3)"
        )
    if cp > 1:  # the rule nxd_tensor_parallel.layout_rules owns, under the YAML's names
        context_chunks(seq, cp, prefix=f"distributed_strategy.context_parallel_size={cp}: ", names=_YAML_SP_NAMES)
    max_pos = getattr(model_config, "max_position_embeddings", None)
    if max_pos is not None and seq > max_pos:
        raise ConfigError(f"data.seq_length={seq} exceeds the model's max_position_embeddings={max_pos}")
    if ds.sequence_parallel:  # the rule nxd_tensor_parallel.layout_rules owns, under the YAML's names
        sequence_shard(seq, tp, cp, prefix="distributed_strategy.sequence_parallel: ", names=_YAML_SP_NAMES)
    vocab = getattr(model_config, "vocab_size", None)
    if vocab is not None:  # padded_vocab_size: the model pads its vocabulary (vocab_padding)
        check_vocab(vocab, tp, padded=callable(getattr(model_config, "padded_vocab_size", None)), names=SizeNames(
            tp="tensor_model_parallel_size", vocab="model vocab_size"))
    model_class = (getattr(spec, "extras", None) or {}).get("model_class")
    if pp > 1 and model_class is not None and not hasattr(model_class, "nxd_pipeline_layout"):
        raise ConfigError(f"distributed_strategy.pipeline_model_parallel_size={pp}: the {spec.name!r} model "
                          f"({model_class.__name__}) does not implement pipeline parallelism (no nxd_pipeline_layout; "
                          "see docs/pipeline.md); use pipeline_model_parallel_size=1 and tensor/expert parallelism")
    model_class = (getattr(spec, "extras", None) or {}).get("model_class")
    _heads(ds, model_config, tp, pads_heads=bool(getattr(model_class, "nxd_pads_attention_heads", False)))


def _heads(ds: DistributedStrategyConfig, model_config: Any, tp: int, pads_heads: bool = False) -> None:
    """The head rule (:func:`nxd_tensor_parallel.layout_rules.head_layout`, the one the ranks' build
    applies) under the YAML's names; NxDT's ``kv_replicator``, when given, must be the replication it
    decides, and is needed when that is not one KV head per rank. ``pads_heads``: the model pads
    query heads TP does not divide itself (NxD's ``pad_model``; GPT, Llama, Qwen3, Mixtral)."""
    heads = getattr(model_config, "num_attention_heads", None)
    kv = getattr(model_config, "num_key_value_heads", None) or getattr(model_config, "num_query_groups", None) or heads
    if heads is None or tp == 1:
        return
    layout = head_layout(heads, kv, tp, pad=pads_heads, names=_YAML_HEAD_NAMES, hint=(
        "" if pads_heads else " (this model does not pad attention heads; nxd's GPT, Llama, Qwen3 and Mixtral do, "
        "and NxD's pad_model covers scripts whose model is built from ColumnParallelLinear/RowParallelLinear "
        "projections)"))
    multiplier, rep = layout.kv_size_multiplier, ds.kv_replicator
    if layout.padding is not None or multiplier == 1:
        return  # padded by the model's plan, or TP divides the K/V heads
    if rep is None:
        if kv * multiplier == tp:
            return  # one K/V head per rank (kv_size_multiplier = TP / kv heads)
        raise ConfigError(
            f"distributed_strategy.tensor_model_parallel_size={tp} must divide num_kv_heads={kv}, or be a multiple "
            f"of it so K/V heads can be replicated (set distributed_strategy.kv_replicator: {multiplier} places "
            "these heads)")
    if (kv * rep) % tp:
        raise ConfigError(
            f"distributed_strategy.kv_replicator={rep}: num_kv_heads x kv_replicator = {kv * rep} must be divisible "
            f"by tensor_model_parallel_size={tp}"
        )
    if rep != multiplier:
        raise ConfigError(
            f"distributed_strategy.kv_replicator={rep}: nxd's models replicate {kv} K/V heads over "
            f"tensor_model_parallel_size={tp} {multiplier} times (each rank then holds the KV heads its query heads "
            f"use); set kv_replicator: {multiplier}"
        )


#: the SP rule's sizes as the YAML names them
_YAML_SP_NAMES = SizeNames(tp="tensor_model_parallel_size", seq="seq_length", cp="context_parallel_size")

#: the head rule's sizes as the YAML names them
_YAML_HEAD_NAMES = SizeNames(tp="distributed_strategy.tensor_model_parallel_size", heads="model num_attention_heads",
                             kv_heads="num_kv_heads")


def _need(kind: str, name: str, key: str, install: str) -> None:
    if name not in nxd.list_components(kind):
        installed = ", ".join(nxd.list_components(kind)) or "none"
        raise ConfigError(f"{key}: needs the {kind.replace('_', ' ')} {name!r} (installed: {installed}); pip install {install}")


def default_data_module(data: DataConfig, align: ModelAlignmentConfig | None, model_source: str,
                        workflow: Any) -> str:
    """``data.module``, else the one the alignment strategy, its ``workflow`` or the model source trains on."""
    if data.module:
        return data.module
    if align is not None and align.sft is not None:
        return "sft"
    if workflow is not None and getattr(workflow, "data_module", None):
        return workflow.data_module
    if (data.model_extra or {}).get("use_sft_style_data_module"):  # NxDT: HF-style SFT data, Megatron model
        return "sft"
    return "indexed" if model_source == "megatron" or "data_prefix" in (data.model_extra or {}) else "hf"


def tokenizer_path(data: DataConfig) -> str | None:
    """``data.tokenizer`` as a path: a string, or NxDT's section (``type``, else ``model``); None
    for a tokenizer built from files (:func:`file_tokenizer`)."""
    tok = data.tokenizer
    if tok is None or isinstance(tok, str):
        return tok
    if file_tokenizer(data) is not None:
        return None
    return tok.type or tok.model or tok.vocab_file


def file_tokenizer(data: DataConfig) -> dict[str, Any] | None:
    """NxDT's ``data.tokenizer`` section when its ``type`` names a tokenizer built from files
    (Megatron's ``GPT2BPETokenizer``: ``vocab_file`` + ``merge_file``), as ``load_tokenizer`` takes it."""
    from nxd_data.tokenizers import FILE_TOKENIZERS

    tok = data.tokenizer
    if isinstance(tok, TokenizerConfig) and tok.type in FILE_TOKENIZERS:
        return tok.model_dump(mode="json")
    return None


def data_section(data: DataConfig, align: ModelAlignmentConfig | None, workflow: Any,
                 seq_length: int) -> dict[str, Any]:
    """The ``data`` section as the data module sees it (common keys, the SFT packing switch and
    the ``workflow``'s data options included)."""
    section = data.model_dump(mode="json", exclude_none=True)
    for key in ("module", "prepare", "prepare_dir", "alignment_strategy"):  # nxd's keys; NxDT's earlier alignment place
        section.pop(key, None)
    path = tokenizer_path(data)
    if path is not None:
        section["tokenizer"] = path
    else:
        section.pop("tokenizer", None)
    section["seq_length"] = seq_length
    if align is not None and align.sft is not None:
        section.setdefault("packing", align.sft.packing)  # NxDT's switch; data.packing wins if both are set
    for key, value in (getattr(workflow, "data_options", None) or {}).items():
        section.setdefault(key, value)  # e.g. dpo.max_prompt_length, truncation_mode
    return section


def _data(name: str, section: dict[str, Any]) -> None:
    """The data module ``name`` is installed and takes ``section``."""
    try:
        factory = nxd.get_data_module(name)
    except ComponentNotFound as exc:
        raise ConfigError(f"data.module: {exc}") from None
    validate = getattr(factory, "validate", None)
    if callable(validate):
        try:
            validate(section)
        except ConfigError as exc:
            text = str(exc)
            raise ConfigError(text if text.startswith("data") else f"data: {text}") from None
        except (TypeError, ValueError, KeyError) as exc:  # a value of the wrong kind the module did not expect
            raise ConfigError(f"data: the {name!r} data module rejected the data section: "
                              f"{type(exc).__name__}: {exc}") from None


def _training(tr: TrainerConfig, optim: OptimConfig, em: ExpManagerConfig, run_name: str) -> None:
    if tr.max_steps == -1 and tr.max_epochs == -1 and tr.max_time is None:
        raise ConfigError("trainer.max_steps and trainer.max_epochs are both -1: set one of them so training ends")
    if tr.max_steps == 0:
        raise ConfigError("trainer.max_steps must be -1 or a positive number of steps, got 0")
    if optim.name.lower() not in OPTIMIZERS:
        from nxd_training.config.errors import suggest

        raise ConfigError(f"model.optim.name: unknown optimizer {optim.name!r}{suggest(optim.name.lower(), list(OPTIMIZERS))}; "
                          f"valid: {', '.join(OPTIMIZERS)}")
    sched = optim.sched
    if sched.name not in SCHEDULES:
        from nxd_training.config.errors import suggest

        raise ConfigError(f"model.optim.sched.name: unknown schedule {sched.name!r}{suggest(sched.name, schedule_names())}; "
                          f"valid: {', '.join(schedule_names())}")
    # warmup (+ constant_steps) longer than the run is valid, as in NxDT/NeMo: see schedules.cosine
    if sched.min_lr > optim.lr:
        raise ConfigError(f"model.optim.sched.min_lr={sched.min_lr} is larger than model.optim.lr={optim.lr}")
    if isinstance(tr.val_check_interval, float) and not tr.val_check_interval.is_integer():
        raise ConfigError(f"trainer.val_check_interval must be a whole number of steps, got {tr.val_check_interval}")
    # exp_manager.save_xser/load_xser name a Neuron file layout; nxd-ckpt writes its own, the flags are accepted
    try:
        em.checkpoint_callback_params.filename.format(name=run_name, step=0, consumed_samples=0, epoch=0)
    except (KeyError, IndexError, ValueError) as exc:
        raise ConfigError(f"exp_manager.checkpoint_callback_params.filename: bad template ({exc}); "
                          "fields available: {name}, {step}, {consumed_samples}, {epoch}") from None
    _run_paths(em, run_name)


def _run_paths(em: ExpManagerConfig, run_name: str) -> None:
    """Every name that becomes a folder of the run stays one folder name (``nxd.paths``): an
    experiment name or version with '/' or '..' would write outside ``exp_dir``, a checkpoint tag so
    formed outside ``checkpoints/`` (the tag is checked as the first save would form it)."""
    if em.explicit_log_dir is None:
        check_name(*((em.name, "exp_manager.name") if em.name else (run_name, "name")))  # "" falls back, as in the run
        if em.version is not None:
            check_name(str(em.version), "exp_manager.version")
    params = em.checkpoint_callback_params
    from nxd_training.exp_manager import checkpoint_tag  # here: exp_manager imports config, which imports this module

    tag = checkpoint_tag(params, run_name, step=1, consumed_samples=1, epoch=0)
    problem = name_problem(tag)
    if problem is not None:
        key = "prefix" if params.prefix and name_problem(params.prefix + "x") else "filename"
        raise ConfigError(f"exp_manager.checkpoint_callback_params.{key}: the checkpoint tag it forms ({tag!r}) "
                          f"{problem}; a tag is one folder name inside the checkpoint folder")


def _plugins(ds: DistributedStrategyConfig, align: ModelAlignmentConfig | None, em: ExpManagerConfig,
             pp: int, dp: int, spec: Any, pretrained: str | None) -> Any:
    """The plugins the sections need are installed; the data-parallel strategy's sizes fit ``dp``.
    Returns the ``peft`` section's LoraConfig (its targets defaulting to the model's; QLoRA's needs
    the ``pretrained`` Hugging Face folder it quantises its base from), or None."""
    lora = None
    if pp > 1:
        schedule = pipeline_schedule(ds.pipeline_schedule, ds.virtual_pipeline_model_parallel_size or 1)
        _need("pipeline_schedule", schedule, "distributed_strategy.pipeline_model_parallel_size", "nxd-pipeline")
    if ds.zero1:
        _need("optimizer", "zero1", "distributed_strategy.zero1", "nxd-zero1")
    if ds.fsdp:
        if ds.zero1:
            raise ConfigError("distributed_strategy.zero1 and distributed_strategy.fsdp are two data-parallel strategies "
                              "(FSDP already shards the optimizer state, with the parameters and gradients): set one")
        _need("model_transform", "fsdp", "distributed_strategy.fsdp", "nxd-fsdp")
        # what needs the world size; nxd-fsdp checks the rest when the run's NxD config is built (preflight)
        replicate = ds.fsdp.get("replicate_degree", 1) if isinstance(ds.fsdp, dict) else 1
        if isinstance(replicate, int) and replicate > 0 and dp % replicate:
            raise ConfigError(f"distributed_strategy.fsdp.replicate_degree={replicate} must divide the data-parallel "
                              f"size {dp} (HSDP: replicas x shards = DP)")
    if align is not None:
        if align.peft is not None:
            if pp > 1:
                raise ConfigError(f"model_alignment_strategy.peft: LoRA does not support pipeline parallelism "
                                  f"(pipeline_model_parallel_size={pp}); use tensor/data parallelism with LoRA")
            _need("adapter", "lora", "model_alignment_strategy.peft", "nxd-lora")
            # its keys checked now, before the QLoRA rules: the one LoraConfig of the run
            lora = lora_config(align.peft, list(getattr(spec, "lora_target_modules", ()) or ()))
            if lora.quantize_base is not None and not pretrained:
                # QLoRA quantises its base from the Hugging Face weights at every start (resumes too): checkpoints
                # leave the frozen NF4 base out. The layouts NF4 cannot take are nxd-lora's (nxd_validate_config);
                # weight_init_only from a QLoRA run's own checkpoint is preflight's (against its record)
                raise ConfigError(f"model_alignment_strategy.peft.quantize_base={lora.quantize_base!r} needs "
                                  "model.pretrained_checkpoint (a Hugging Face folder): QLoRA fine-tunes a pretrained "
                                  "base, quantised from those weights at every start; checkpoints hold the adapters "
                                  "and the other tensors, not the frozen NF4 base")
    if em.create_checkpoint_callback or em.resume_if_exists:
        _need("checkpointer", "default", "exp_manager.create_checkpoint_callback", "nxd-ckpt")
    return lora


def qlora_mode(config: TrainingConfig) -> str | None:
    """``model_alignment_strategy.peft.quantize_base`` (QLoRA's base format), or ``None``."""
    align = config.model_alignment_strategy
    return (align.peft or {}).get("quantize_base") if align is not None and align.peft is not None else None


def resolve_config(config: TrainingConfig, check_data: bool = True) -> TrainingConfig:
    """Resolve ``config`` once: every rule checked, every choice recorded (``model.architecture``
    set to the model the run builds), the result carrying its :class:`nxd.run_config.RunConfig`
    (``config.run``). A resolved config is returned as it is. ``check_data=False`` skips the data
    module's own checks (its files need not exist: ``nxd plan`` sizes a run on a machine that does
    not hold its data)."""
    if config.resolved:
        return config
    spec, derived, recompute, lora = derive(config, check_data)
    sections = config.model_dump(by_alias=True)
    sections["model"]["architecture"] = spec.name
    notes = key_notes(config, spec, sections)  # keys of earlier NxDT releases written under their newer names
    derived = dataclasses.replace(derived, notes=(*notes, *derived.notes))
    resolved = TrainingConfig.model_validate(sections)
    return resolved.with_run(run_config(resolved, derived, recompute, lora))  # the one translation


def derive(config: TrainingConfig, check_data: bool = True) -> tuple[Any, Derived, Any, Any]:
    """Check every cross-field rule and the plugins the run needs; return (the model spec, the
    derived values, the activation-checkpoint classes, the LoraConfig or None), each computed once.
    The model comes first: a config for a model nxd cannot build is refused for that reason."""
    spec, as_dict, model_config, reason, covered_notes, recompute = _model(config)
    ds, align = config.distributed_strategy, config.model_alignment_strategy
    world, tp, pp, dp, num_mb, seq = _sizes(ds, config.trainer, config.data, config.model)
    _training(config.trainer, config.model.optim, config.exp_manager, config.name)
    needed = check_precision(config.precision, ds)
    if needed is not None:
        _need(*needed)
    lora = _plugins(ds, align, config.exp_manager, pp, dp, spec, config.model.pretrained_checkpoint)
    _layout_fits_model(ds, spec, model_config, seq, tp, pp)
    workflow_key, workflow = build_workflow(align)
    if workflow is not None and pp > 1 and not getattr(workflow, "supports_pipeline", False):
        raise ConfigError(f"model_alignment_strategy.{workflow_key} does not support pipeline parallelism "
                          f"(pipeline_model_parallel_size={pp}): the pipeline schedule computes the next-token loss "
                          "itself; use tensor/data parallelism")
    cp = ds.context_parallel_size
    if workflow is not None and cp > 1:
        raise ConfigError(f"model_alignment_strategy.{workflow_key} does not support context parallelism "
                          f"(context_parallel_size={cp}): its loss reads whole sequences (pairs of responses), "
                          "which CP splits over ranks; use context_parallel_size=1")
    data_module = default_data_module(config.data, align, config.model_source, workflow)
    section = data_section(config.data, align, workflow, seq)  # what the data module validates and every rank builds
    if check_data:
        _data(data_module, section)
    needs = getattr(workflow, "data_module", None)
    if needs and data_module != needs:
        raise ConfigError(f"model_alignment_strategy.{workflow_key} trains on the {needs!r} data module, but "
                          f"data.module={data_module!r}; remove data.module or set it to {needs!r}")
    derived = Derived(architecture=spec.name, architecture_reason=reason, model=as_dict, world_size=world, dp=dp,
                      num_microbatches=num_mb, seq_length=seq, data_module=data_module, data=section,
                      workflow=workflow_key, notes=tuple(covered_notes))
    return spec, derived, recompute, lora
