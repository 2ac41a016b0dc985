"""``migrate_config``: a Neuron NeMo-Megatron (NNM) or NeMo YAML -> nxd's YAML (NxD Training's layout).

Every source key ends up in exactly one place of the :class:`MigrationReport`: moved (to its nxd
key), removed (no effect in nxd, with the reason) or unsupported (would change training; not
applied). The result is checked against nxd-training's schema before it is returned.
"""

from __future__ import annotations

import re
import typing
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from nxd_migrate.rules import (
    MOVES,
    NEUTRAL,
    OPTIMIZER_NAMES,
    PRECISION,
    REMOVED,
    SECTION_MOVES,
)
from nxd_training.config import TrainingConfig, parse_config

#: data keys nxd's data modules read (the schema lets the data section hold module-specific keys)
DATA_KEYS = {"module", "micro_batch_size", "global_batch_size", "seq_length", "tokenizer", "prepare", "prepare_dir",
             "data_prefix", "splits_string", "reset_position_ids", "reset_attention_mask", "eod_mask_loss", "shuffle",
             "train_dir", "val_dir", "test_dir", "packing", "use_sft_style_data_module", "dev_choose_samples"}

_REF = re.compile(r"\$\{([^${}:]+)\}")


@dataclass
class MigrationReport:
    source_kind: str
    moved: list[tuple[str, str]] = field(default_factory=list)
    removed: list[tuple[str, Any, str]] = field(default_factory=list)
    unsupported: list[tuple[str, Any, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.unsupported

    def format(self) -> str:
        lines = [f"source: {self.source_kind}; {len(self.moved)} keys mapped, {len(self.removed)} removed "
                 f"(no effect in nxd), {len(self.unsupported)} unsupported"]
        if self.unsupported:
            lines.append("unsupported (NOT applied; training would differ):")
            lines += [f"  {k}: {v!r}  -- {why}" for k, v, why in self.unsupported]
        if self.removed:
            lines.append("removed (no effect in nxd):")
            lines += [f"  {k}: {v!r}  -- {why}" for k, v, why in self.removed]
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


def detect_kind(raw: dict[str, Any]) -> str:
    """``nxd`` for NxD Training / nxd layouts (a distributed_strategy section), ``nemo`` for NeMo
    (mcore or distributed_fused_adam traits), else ``nnm``."""
    if "distributed_strategy" in raw:
        return "nxd"
    model = raw.get("model") or {}
    optim = model.get("optim") or {} if isinstance(model, dict) else {}
    if isinstance(model, dict) and ("mcore_gpt" in model or "num_query_groups" in model
                                    or optim.get("name") == "distributed_fused_adam"):
        return "nemo"
    return "nnm"


def _flatten(node: Any, prefix: str = "") -> list[tuple[str, Any]]:
    if not isinstance(node, dict):
        return [(prefix, node)]
    if not node and prefix:
        return [(prefix, node)]
    out: list[tuple[str, Any]] = []
    for key, value in node.items():
        out += _flatten(value, f"{prefix}.{key}" if prefix else str(key))
    return out


def target_of(path: str) -> str:
    """Where a source key lives in nxd's layout (unknown keys keep their path)."""
    if path in MOVES:
        return MOVES[path]
    for src, dst in SECTION_MOVES.items():
        if path.startswith(src + "."):
            return dst + path[len(src):]
    for src, dst in MOVES.items():  # a key inside a moved section (e.g. model.tokenizer.type)
        if path.startswith(src + "."):
            return dst + path[len(src):]
    return path


def _model_class(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_class(arg)
        if found is not None:
            return found
    return None


def _is_mapping(annotation: Any) -> bool:
    return annotation is dict or typing.get_origin(annotation) is dict or any(_is_mapping(a) for a in typing.get_args(annotation))


def schema_accepts(path: str) -> bool:
    """Whether ``path`` names a key of nxd-training's schema."""
    parts = path.split(".")
    if parts[0] == "data" and len(parts) >= 2:
        if parts[1] == "tokenizer":
            return len(parts) == 2 or parts[2] in _fields(_model_class(TrainingConfig.model_fields["data"].annotation)
                                                          .model_fields["tokenizer"].annotation)
        return parts[1] in DATA_KEYS and len(parts) == 2
    cls: type[BaseModel] | None = TrainingConfig
    for i, part in enumerate(parts):
        if cls is None:
            return False
        fields = {**{n: f for n, f in cls.model_fields.items()},
                  **{f.alias: f for f in cls.model_fields.values() if f.alias}}
        if part not in fields:
            return False
        annotation = fields[part].annotation
        if i == len(parts) - 1:
            return True
        if _is_mapping(annotation) and _model_class(annotation) is None:
            return True
        cls = _model_class(annotation)
    return True


def _fields(annotation: Any) -> set[str]:
    cls = _model_class(annotation)
    return set(cls.model_fields) if cls is not None else set()


def _set(tree: dict[str, Any], path: str, value: Any) -> None:
    parts = path.split(".")
    node = tree
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value


def _rewrite_refs(value: Any, source_path: str) -> Any:
    """Interpolations follow the keys they point at; ``${.x}`` (relative) becomes absolute."""
    if not isinstance(value, str) or "${" not in value:
        return value
    parent = source_path.rpartition(".")[0]

    def sub(match: re.Match[str]) -> str:
        ref = match.group(1).strip()
        if ref.startswith("."):
            ref = f"{parent}{ref}" if parent else ref[1:]
        return "${" + target_of(ref) + "}"

    return _REF.sub(sub, value)


def _convert_value(path: str, value: Any, out: dict[str, Any], report: MigrationReport) -> bool:
    """Keys whose value changes on the way; returns True when handled."""
    if path == "trainer.precision":
        kind = PRECISION.get(str(value))
        if kind is None:
            report.unsupported.append((path, value, f"valid: {', '.join(PRECISION)} (fp16 is not supported)"))
        else:
            _set(out, "precision.type", kind)
            report.moved.append((path, "precision.type"))
        return True
    if path == "trainer.accelerator":
        _set(out, "trainer.accelerator", "auto")
        report.moved.append((path, "trainer.accelerator"))
        if value not in ("auto", "cpu", "cuda", "gpu", None):
            report.notes.append(f"trainer.accelerator={value!r} became 'auto' (CUDA when visible, else CPU; "
                                "Trainium through the xla backend)")
        return True
    if path in ("trainer.max_epochs", "trainer.max_steps") and value is None:
        _set(out, path, -1)
        report.moved.append((path, path))
        return True
    if path == "model.optim.name":
        name, zero1 = OPTIMIZER_NAMES.get(str(value), (None, False))
        if name is None:
            report.unsupported.append((path, value, f"valid: {', '.join(OPTIMIZER_NAMES)}"))
            return True
        _set(out, "model.optim.name", name)
        report.moved.append((path, "model.optim.name"))
        if zero1:
            _set(out, "distributed_strategy.zero1", True)
            report.notes.append(f"model.optim.name={value} is a ZeRO-1 style optimizer: distributed_strategy.zero1=true")
        return True
    return False


def migrate_config(raw: dict[str, Any], source: str = "auto") -> tuple[dict[str, Any], MigrationReport]:
    """Convert ``raw`` (an NNM or NeMo YAML mapping) to nxd's YAML mapping, validated by nxd's schema."""
    if not isinstance(raw, dict):
        raise ValueError(f"a config must be a mapping of sections, got {type(raw).__name__}")
    kind = detect_kind(raw) if source == "auto" else source
    if kind not in ("nnm", "nemo", "nxd"):
        raise ValueError(f"source must be auto, nnm, nemo or nxd, got {source!r}")
    report = MigrationReport(kind)
    if kind == "nxd":
        parse_config(raw, source="config")
        report.notes.append("already in nxd / NxD Training layout: copied unchanged")
        return dict(raw), report
    out: dict[str, Any] = {"model_source": "megatron"}
    for path, value in _flatten(raw):
        if path in REMOVED:
            report.removed.append((path, value, REMOVED[path]))
        elif path in NEUTRAL:
            neutral, why = NEUTRAL[path]
            (report.removed if value in neutral else report.unsupported).append(
                (path, value, ("neutral value; " if value in neutral else "") + why))
        elif _convert_value(path, value, out, report):
            pass
        else:
            target = target_of(path)
            if schema_accepts(target):
                _set(out, target, _rewrite_refs(value, path))
                report.moved.append((path, target))
            else:
                report.unsupported.append((path, value, "no such setting in nxd"))
    _finish(out, report)
    parse_config(out, source="migrated config")  # raises nxd.ConfigError naming the key if anything is off
    return out, report


def _finish(out: dict[str, Any], report: MigrationReport) -> None:
    model = out.setdefault("model", {})
    family = (model.get("activation", "swiglu"), model.get("normalization", "rmsnorm"),
              model.get("position_embedding_type", "rope"))
    if family == ("swiglu", "rmsnorm", "rope"):
        model.setdefault("architecture", "llama")
    else:
        report.notes.append(f"model (activation, normalization, position_embedding_type) = {family}: a GPT-style "
                            "model; nxd ships Llama only, so set model.architecture to a plugin that builds it")
    data = out.get("data", {})
    if "data_prefix" in data:
        data.setdefault("module", "indexed")
    tok = data.get("tokenizer")
    if isinstance(tok, dict) and tok.get("library") == "megatron" and tok.get("type") != "GPT2BPETokenizer":
        # GPT2BPETokenizer is read from its vocab_file/merge_file (nxd_data.tokenizers.FILE_TOKENIZERS)
        report.notes.append("data.tokenizer.library=megatron: give nxd a tokenizer.json "
                            "(nxd data train-tokenizer, or the HF tokenizer of the model)")
