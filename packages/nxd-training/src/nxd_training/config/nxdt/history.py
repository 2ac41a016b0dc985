"""NxD Training keys that nxd reads with a note in the resolved config (``resolved.derived.notes``, which
``nxd train`` prints): keys of earlier releases, Neuron-only keys, keys accepted without effect.

Keys of earlier NxD Training releases that later releases renamed or replaced are read with the
meaning NxDT gave them (from NxDT's own model code of that release), or refused naming the newer
key to use:

- ``model.activations_checkpoint_recompute_mlp`` (NxDT 2.20, examples/conf/hf_llama3_70B_config.yaml;
  replaced by ``activations_checkpoint_recompute: [CoreAttention, LlamaMLP]``): with
  ``activations_checkpoint_granularity: selective`` NxDT's HF models recomputed the core attention,
  and also the MLP (Llama's ``LlamaMLP``, Mixtral's ``MoE``) when ``model.encoder_seq_length >= 8192``.
- ``trainer.vnc`` (NxDT's first Trn2 configs, Nov 2024; renamed ``trainer.lnc``): the logical
  NeuronCore size, a Neuron-only setting.
- ``data.alignment_strategy`` (NxDT's SFT/DPO configs of Oct-Dec 2024; moved to the top-level
  ``model_alignment_strategy``): NxDT's ``training.py`` chose its alignment data module and its
  model code the DPO loss from ``data.alignment_strategy.sft`` / ``.dpo``, with the same keys.

``NEURON_ONLY_KEYS`` only configure the Neuron compiler, runtime or NeuronCores: NxDT turns them into environment variables for neuronx-cc and the Neuron runtime
(``training_orchestrator.process_config``; its schema groups the top-level ones as "Neuron-specific
configurations"). nxd accepts them, so NxDT's configs run unchanged, and says once per key set that
it has no effect here: a note, never silence.

``NO_EFFECT_KEYS`` are the other NxDT keys nxd accepts without acting on them (logging and
instrumentation extras NxDT's configs set): the same one note per key set."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from nxd import ConfigError
from nxd_training.config.errors import config_error
from nxd_training.config.features import value_at
from nxd_training.config.schema import ModelAlignmentConfig, ModelConfig, TrainingConfig

#: key -> what it sets on Neuron
NEURON_ONLY_KEYS: dict[str, str] = {
    "compiler_flags": "neuronx-cc's flags (NEURON_CC_FLAGS)",
    "compiler_cache_url": "the Neuron compile cache (NEURON_COMPILE_CACHE_URL)",
    "aync_exec_max_inflight_requests": "the Neuron runtime's queue depth (NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS)",
    "bucket_size_collectives": "the XLA gradient all-reduce bucket size (BUCKET_CAP_MB)",
    "neuron_rt_exec_timeout": "the Neuron runtime's per-execution timeout (NEURON_RT_EXEC_TIMEOUT; nxd's collective "
                              "bound is distributed_strategy.collective_timeout)",
    "neuron_experimental_compress_rg": "compressed replica groups (NEURON_EXPERIMENTAL_COMPRESS_RG)",
    "trainer.lnc": "the logical NeuronCore size (trn2)",
    "model.fusions.softmax": "the Neuron compiler's fused softmax (NEURON_FUSE_SOFTMAX)",
    "precision.xla_use_bf16": "XLA_USE_BF16 (nxd's dtypes come from precision.type)",
    "precision.xla_downcast_bf16": "XLA_DOWNCAST_BF16 (nxd's dtypes come from precision.type)",
    "precision.neuron_rt_stochastic_rounding_en": "the Neuron runtime's stochastic rounding "
                                                  "(NEURON_RT_STOCHASTIC_ROUNDING_EN; nxd's comes from precision.type)",
}


#: key -> what NxD Training does with it that nxd does not
NO_EFFECT_KEYS: dict[str, str] = {
    "exp_manager.log_parameter_norm": "NxD Training logs the parameters' global norm every step; nxd logs the "
                                      "gradient norm (log_gradient_norm) but not the parameter norm",
    "exp_manager.enable_recovery_time_instrumentation": "NxD Training prints a timing breakdown of checkpoint "
                                                        "recovery; nxd's checkpoint metrics rows hold save/load times",
    "exp_manager.save_bf16": "NxD Training saves bf16 copies of the weights; nxd saves the weights in their "
                             "training dtype",
    "trainer.num_sanity_val_steps": "NxD Training (Lightning) runs validation steps before training; nxd does not",
}


#: NxDT 2.20's ``model.activations_checkpoint_recompute_mlp`` : NxDT's MLP class names that ``activations_checkpoint_recompute_mlp`` recomputed (its HF Llama and Mixtral)
_NXDT_MLP_NAMES = ("LlamaMLP", "MoE")
#: NxDT recomputed the MLP only from this sequence length on (its llama_model.py / mixtral_model.py)
RECOMPUTE_MLP_MIN_SEQ = 8192


def recompute_names(m: ModelConfig, spec: Any) -> list[str] | None:
    """``model.activations_checkpoint_recompute``, or the list NxDT's older
    ``activations_checkpoint_recompute_mlp`` meant for this model."""
    if m.activations_checkpoint_recompute_mlp is None:
        return m.activations_checkpoint_recompute
    if m.activations_checkpoint_recompute:
        raise ConfigError("model.activations_checkpoint_recompute_mlp (NxD Training 2.20) and its replacement "
                          "model.activations_checkpoint_recompute are both set; keep activations_checkpoint_recompute")
    if not m.activations_checkpoint_recompute_mlp or m.activations_checkpoint_granularity != "selective":
        return None
    seq = m.encoder_seq_length or 0
    if seq < RECOMPUTE_MLP_MIN_SEQ:
        return ["CoreAttention"]
    known = dict(getattr(spec, "recompute_modules", {}) or {})
    mlp = [name for name in _NXDT_MLP_NAMES if name in known]
    if not mlp:
        raise ConfigError(
            f"model.activations_checkpoint_recompute_mlp=true (NxD Training 2.20) recomputes the MLP "
            f"({' / '.join(_NXDT_MLP_NAMES)}) at encoder_seq_length={seq} >= {RECOMPUTE_MLP_MIN_SEQ}, and the "
            f"{spec.name!r} model has no such module to recompute; use the newer key "
            f"model.activations_checkpoint_recompute with names it can recompute: {', '.join(sorted(known)) or 'none'}")
    return ["CoreAttention", mlp[0]]


def lift_alignment(config: TrainingConfig) -> TrainingConfig:
    """Read ``data.alignment_strategy`` as ``model_alignment_strategy`` (in place): every later
    step (workflow, data module, LoRA) then sees the section where NxDT's later releases put it.
    The earlier key stays in ``data`` until :func:`key_notes` rewrites the dumped config, so the
    resolved notes can say how it was read."""
    earlier = (config.data.model_extra or {}).get("alignment_strategy")
    if earlier is None:
        return config
    if config.model_alignment_strategy is not None:
        raise ConfigError("data.alignment_strategy (NxD Training's earlier place of model_alignment_strategy) and "
                          "model_alignment_strategy are both set; keep model_alignment_strategy")
    try:
        config.model_alignment_strategy = ModelAlignmentConfig.model_validate(earlier)
    except ValidationError as exc:
        raise config_error(ModelAlignmentConfig, exc, "data.alignment_strategy") from None
    return config


def key_notes(config: TrainingConfig, spec: Any, sections: dict[str, Any]) -> list[str]:
    """Each older key once: refuse it beside a newer key that disagrees, rewrite it in ``sections``
    (the dumped config, in place) under its newer key, so the resolved config says what the run does
    in today's terms, and note how it was read. Then one note per Neuron-only key set (a value other
    than null, false or 0), then one per NO_EFFECT_KEYS key set."""
    notes = []
    m, tr = config.model, config.trainer
    if m.activations_checkpoint_recompute_mlp is not None:
        names = recompute_names(m, spec)
        notes.append(f"model.activations_checkpoint_recompute_mlp={m.activations_checkpoint_recompute_mlp} "
                     "(NxD Training 2.20) read as its newer key model.activations_checkpoint_recompute="
                     f"{names if names is not None else 'null'} (NxDT recomputed the MLP from "
                     f"encoder_seq_length {RECOMPUTE_MLP_MIN_SEQ} on, with granularity selective)")
        sections["model"].update(activations_checkpoint_recompute=names, activations_checkpoint_recompute_mlp=None)
    if tr.vnc is not None:
        if tr.lnc is not None and tr.lnc != tr.vnc:
            raise ConfigError(f"trainer.vnc={tr.vnc} and trainer.lnc={tr.lnc} disagree: vnc is NxD Training's earlier "
                              "name of lnc (the logical NeuronCore size); keep trainer.lnc")
        notes.append(f"trainer.vnc={tr.vnc} (NxD Training's earlier name) read as trainer.lnc={tr.vnc}: the logical "
                     "NeuronCore size, a Neuron-only setting with no effect on cpu/cuda")
        sections["trainer"].update(lnc=tr.vnc, vnc=None)
    earlier = sections["data"].pop("alignment_strategy", None)  # lifted into model_alignment_strategy (lift_alignment)
    if earlier is not None:
        notes.append(f"data.alignment_strategy ({', '.join(sorted(earlier))}; NxD Training's configs of "
                     "Oct-Dec 2024) read as its later place model_alignment_strategy, with the same keys")
    neuron_only = {key: f"on Neuron, NxD Training sets {what} from it; nxd does not pass it on" for key, what
                   in NEURON_ONLY_KEYS.items()}
    for key, what in {**neuron_only, **NO_EFFECT_KEYS}.items():
        value: Any = value_at(config, key)
        if str(value).strip().lower() not in ("none", "false", "0", ""):  # NxDT writes some flags as '0'/'1'
            notes.append(f"{key}={value!r}: {what}, so it has no effect on this run")
    return notes
