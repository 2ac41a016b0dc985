"""Keys of earlier NxD Training releases that later releases renamed or replaced.

Each is read with the meaning NxDT gave it (from NxDT's own model code of that release), or
refused naming the newer key to use. What was done is recorded as a note in the resolved config
(``resolved.notes``), which ``nxd train`` prints.

- ``model.activations_checkpoint_recompute_mlp`` (NxDT 2.20, examples/conf/hf_llama3_70B_config.yaml;
  replaced by ``activations_checkpoint_recompute: [CoreAttention, LlamaMLP]``): with
  ``activations_checkpoint_granularity: selective`` NxDT's HF models recomputed the core attention,
  and also the MLP (Llama's ``LlamaMLP``, Mixtral's ``MoE``) when ``model.encoder_seq_length >= 8192``.
- ``trainer.vnc`` (NxDT's first Trn2 configs, Nov 2024; renamed ``trainer.lnc``): the logical
  NeuronCore size, a Neuron-only setting.
- ``data.alignment_strategy`` (NxDT's SFT/DPO configs of Oct-Dec 2024; moved to the top-level
  ``model_alignment_strategy``): NxDT's ``training.py`` chose its alignment data module and its
  model code the DPO loss from ``data.alignment_strategy.sft`` / ``.dpo``, with the same keys.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from nxd import ConfigError
from nxd_training.config.errors import config_error
from nxd_training.config.schema import ModelAlignmentConfig, TrainingConfig

#: NxDT's MLP class names that ``activations_checkpoint_recompute_mlp`` recomputed (its HF Llama and Mixtral)
_NXDT_MLP_NAMES = ("LlamaMLP", "MoE")
#: NxDT recomputed the MLP only from this sequence length on (its llama_model.py / mixtral_model.py)
_RECOMPUTE_MLP_MIN_SEQ = 8192


def recompute_names(config: TrainingConfig, spec: Any) -> list[str] | None:
    """``model.activations_checkpoint_recompute``, or the list NxDT's older
    ``activations_checkpoint_recompute_mlp`` meant for this model."""
    m = config.model
    if m.activations_checkpoint_recompute_mlp is None:
        return m.activations_checkpoint_recompute
    if m.activations_checkpoint_recompute:
        raise ConfigError("model.activations_checkpoint_recompute_mlp (NxD Training 2.20) and its replacement "
                          "model.activations_checkpoint_recompute are both set; keep activations_checkpoint_recompute")
    if not m.activations_checkpoint_recompute_mlp or m.activations_checkpoint_granularity != "selective":
        return None
    seq = m.encoder_seq_length or 0
    if seq < _RECOMPUTE_MLP_MIN_SEQ:
        return ["CoreAttention"]
    known = dict(getattr(spec, "recompute_modules", {}) or {})
    mlp = [name for name in _NXDT_MLP_NAMES if name in known]
    if not mlp:
        raise ConfigError(
            f"model.activations_checkpoint_recompute_mlp=true (NxD Training 2.20) recomputes the MLP "
            f"({' / '.join(_NXDT_MLP_NAMES)}) at encoder_seq_length={seq} >= {_RECOMPUTE_MLP_MIN_SEQ}, and the "
            f"{spec.name!r} model has no such module to recompute; use the newer key "
            f"model.activations_checkpoint_recompute with names it can recompute: {', '.join(sorted(known)) or 'none'}")
    return ["CoreAttention", mlp[0]]


def earlier_alignment(config: TrainingConfig) -> Any:
    """``data.alignment_strategy`` as NxDT's Oct-Dec 2024 configs wrote it, or None."""
    return (config.data.model_extra or {}).get("alignment_strategy")


def lift_alignment(config: TrainingConfig) -> TrainingConfig:
    """Read ``data.alignment_strategy`` as ``model_alignment_strategy`` (in place): every later
    step (workflow, data module, LoRA) then sees the section where NxDT's later releases put it.
    The earlier key stays in ``data`` until :func:`newer_keys` writes the config out, so the
    resolved notes can say how it was read."""
    earlier = earlier_alignment(config)
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


def check_legacy(config: TrainingConfig, spec: Any) -> list[str]:
    """Refuse conflicting old/new keys; return notes saying how each older key was read."""
    notes = []
    m, tr = config.model, config.trainer
    if m.activations_checkpoint_recompute_mlp is not None:
        names = recompute_names(config, spec)
        notes.append(f"model.activations_checkpoint_recompute_mlp={m.activations_checkpoint_recompute_mlp} "
                     "(NxD Training 2.20) read as its newer key model.activations_checkpoint_recompute="
                     f"{names if names is not None else 'null'} (NxDT recomputed the MLP from "
                     f"encoder_seq_length {_RECOMPUTE_MLP_MIN_SEQ} on, with granularity selective)")
    if tr.vnc is not None:
        if tr.lnc is not None and tr.lnc != tr.vnc:
            raise ConfigError(f"trainer.vnc={tr.vnc} and trainer.lnc={tr.lnc} disagree: vnc is NxD Training's earlier "
                              "name of lnc (the logical NeuronCore size); keep trainer.lnc")
        notes.append(f"trainer.vnc={tr.vnc} (NxD Training's earlier name) read as trainer.lnc={tr.vnc}: the logical "
                     "NeuronCore size, a Neuron-only setting with no effect on cpu/cuda")
    if earlier_alignment(config) is not None:
        notes.append(f"data.alignment_strategy ({', '.join(sorted(earlier_alignment(config)))}; NxD Training's configs of "
                     "Oct-Dec 2024) read as its later place model_alignment_strategy, with the same keys")
    return notes


def newer_keys(sections: dict[str, Any], config: TrainingConfig, spec: Any) -> None:
    """Rewrite the older keys in ``sections`` (a dumped config) as their newer keys, in place, so
    the resolved config says what the run does in today's terms."""
    tr, m = sections["trainer"], sections["model"]
    sections["data"].pop("alignment_strategy", None)  # lifted into model_alignment_strategy (lift_alignment)
    if tr.get("vnc") is not None:
        tr["lnc"], tr["vnc"] = tr["vnc"], None
    if m.get("activations_checkpoint_recompute_mlp") is not None:
        m["activations_checkpoint_recompute"] = recompute_names(config, spec)
        m["activations_checkpoint_recompute_mlp"] = None
