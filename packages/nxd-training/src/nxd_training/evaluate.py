"""``nxd eval`` and ``nxd generate``: the validation loss and samples of the checkpoint a user names.

The checkpoint is the weights' only source. The run's ``config.yaml`` gives the data, tokenizer,
adapters and precision; the checkpoint's model record gives the model (its name and config), so
``model.pretrained_checkpoint`` (the Hugging Face folder the run started from) is never read, except by
QLoRA, whose checkpoints leave the frozen NF4 base out: it is quantised from that folder again. It
runs in one process at TP = PP = CP = EP = DP = 1 whatever layout wrote the checkpoint (TP/PP/DP/EP,
ZeRO-1, FSDP): nxd-ckpt reshards on load, and only weights load (no optimizer, no data position).
The eval builds through the trainer itself (:class:`nxd_training.loop.Trainer`): the same model,
adapters, transforms and validation loop a training run uses.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nxd import ConfigError

#: distributed_strategy keys set to one process's layout (weights reshard on load)
ONE_PROCESS = {"tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1, "context_parallel_size": 1,
               "expert_model_parallel_size": 1, "virtual_pipeline_model_parallel_size": 1,
               "sequence_parallel": False, "zero1": False, "fsdp": False, "kv_replicator": None}


@dataclass(frozen=True)
class EvalTarget:
    """One checkpoint and the run config that trained it."""

    config_path: Path  # the run's config.yaml (written by nxd train)
    checkpoints: str  # the directory holding the checkpoint tags
    tag: str
    record: dict[str, Any]  # the checkpoint's model record (nxd_ckpt.run_dir), {} when it has none

    @property
    def path(self) -> str:
        return f"{self.checkpoints}/{self.tag}"


def _tags(path: Path) -> list[str]:
    from nxd_ckpt.layout import list_tags
    from nxd_ckpt.storage import open_storage

    return [i.tag for i in list_tags(open_storage(str(path)))] if path.is_dir() else []


def locate(path: str, tag: str | None = None, config: str | None = None) -> EvalTarget:
    """The checkpoint ``path`` names: a run directory of ``nxd train`` (its newest complete checkpoint,
    or ``tag``), a checkpoint directory (holding tags), or one checkpoint (``.../checkpoints/<tag>``).
    The run config is ``config``, else the ``config.yaml`` of the run the checkpoint lies in."""
    from nxd_ckpt.consolidate import resolve_tag
    from nxd_ckpt.run_dir import checkpoint_record
    from nxd_training.config.loader import parse_config, read_yaml
    from nxd_training.exp_manager import checkpoint_dir

    p = Path(path).resolve()
    if not p.exists():
        raise ConfigError(f"{path}: no such run directory or checkpoint")
    if (p / "config.yaml").is_file() and not _tags(p):  # a run directory: its checkpoints are where it wrote them
        found_config = p / "config.yaml"
        root = checkpoint_dir(parse_config(read_yaml(found_config), source=str(found_config)).exp_manager, p)
    elif p.name in _tags(p.parent):  # one checkpoint
        root, tag = str(p.parent), tag or p.name
        if tag != p.name:
            raise ConfigError(f"--tag {tag} disagrees with the checkpoint named ({p.name}); give one of them")
        found_config = next((d / "config.yaml" for d in (p.parent.parent, p.parent) if (d / "config.yaml").is_file()), None)
    elif _tags(p):  # a checkpoint directory
        root = str(p)
        found_config = next((d / "config.yaml" for d in (p.parent, p) if (d / "config.yaml").is_file()), None)
    else:
        raise ConfigError(f"{path}: neither a run directory of nxd train (config.yaml + checkpoints/) nor a "
                          "checkpoint directory (tags with a 'done' marker)")
    config_path = Path(config) if config else found_config
    if config_path is None or not config_path.is_file():
        raise ConfigError(f"{path}: no config.yaml of the run that wrote it next to it; give it with --config "
                          "(the run directory's config.yaml: data, tokenizer, adapters and precision come from it)")
    tag = resolve_tag(str(root), tag)
    return EvalTarget(config_path, str(root), tag, checkpoint_record(str(root), tag))


def _set(raw: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    node = raw
    for part in parents:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[last] = value


def eval_config(target: EvalTarget, scratch: Path, overrides: Sequence[str] = ()) -> Any:
    """The run's config for one process reading ``target``'s weights (resolved); ``overrides``
    (``trainer.limit_val_batches=10``, ``data.val_dir=...``) apply last."""
    from nxd_training.config.loader import load_config, read_yaml
    from nxd_training.config.resolved import RESOLVED_KEY

    raw = {k: v for k, v in read_yaml(target.config_path).items() if k != RESOLVED_KEY}
    settings: dict[str, Any] = {"trainer.devices": 1, "trainer.num_nodes": 1,
                                **{f"distributed_strategy.{k}": v for k, v in ONE_PROCESS.items()},
                                "exp_manager.resume_if_exists": False,
                                "exp_manager.resume_from_checkpoint": target.path,
                                "exp_manager.create_checkpoint_callback": False,
                                "exp_manager.create_tensorboard_logger": False,
                                "exp_manager.explicit_log_dir": str(scratch),
                                "exp_manager.checkpoint_callback_params.dirpath": None,
                                "model.weight_init_only": True, "model.pretrained_checkpoint": None,
                                "trainer.enable_progress_bar": False}
    if target.record.get("name") and target.record.get("config"):
        # the model the checkpoint records: nothing is read from the folder the run started from
        settings.update({"model.architecture": target.record["name"], "model.model_config": target.record["config"]})
    elif (raw.get("model") or {}).get("pretrained_checkpoint"):
        # no record (not written by nxd train): the folder's config.json still describes the model
        settings["model.model_config"] = raw["model"]["pretrained_checkpoint"]
    peft = (raw.get("model_alignment_strategy") or {}).get("peft") or {}
    if peft.get("quantize_base"):
        # QLoRA: its checkpoints leave the frozen NF4 base out; it is quantised from the run's folder again
        settings["model.pretrained_checkpoint"] = (raw.get("model") or {}).get("pretrained_checkpoint")
    for key, value in settings.items():
        _set(raw, key, value)
    return load_config(raw, list(overrides))


def describe(target: EvalTarget) -> str:
    """``<ckpt> (step N, written at TP 2 x PP 1 x DP 2)`` as far as the checkpoint records it."""
    from nxd_ckpt.convert import read_user_content
    from nxd_ckpt.layout import read_done
    from nxd_ckpt.metadata import read_metadata
    from nxd_ckpt.storage import open_storage

    storage = open_storage(target.checkpoints)
    meta = read_metadata(storage, target.tag, read_done(storage, target.tag).get("metadata")) or {}
    content = read_user_content(target.checkpoints, target.tag)
    facts = [f"step {content['step']}"] if isinstance(content, dict) and "step" in content else []
    degrees = meta.get("degrees")
    if degrees:
        shown = [k for k in ("tp", "pp", "cp", "dp", "ep") if k in degrees and (k in ("tp", "pp", "dp") or degrees[k] > 1)]
        facts.append("written at " + " x ".join(f"{k.upper()} {degrees[k]}" for k in shown))
    if target.record.get("lora"):
        facts.append("LoRA adapters included")
    return f"{target.path}" + (f" ({', '.join(facts)})" if facts else "")


@contextmanager
def loaded(target: EvalTarget, overrides: Sequence[str] = ()) -> Iterator[Any]:
    """A :class:`Trainer` on one process holding ``target``'s weights (closed on exit); it writes
    only to a temporary directory."""
    from nxd_training.loop import Trainer

    with tempfile.TemporaryDirectory(prefix="nxd-eval-") as scratch:
        config = eval_config(target, Path(scratch), overrides)
        trainer = Trainer(config, Path(scratch))
        try:
            trainer.resume()
            yield trainer
        finally:
            trainer.close()


def sample_prompts(trainer: Any, count: int, prompt_tokens: int = 8) -> list[str]:
    """``count`` prompts: the run's ``generation.prompts``, then the openings of validation sequences."""
    from nxd_data.tokenizers import load_tokenizer
    from nxd_training.config.plan import tokenizer_path

    gen = trainer.config.generation
    prompts = list(gen.prompts if gen is not None else [])[:count]
    path = tokenizer_path(trainer.config.data)
    if len(prompts) < count and path is not None:
        tokenizer = load_tokenizer(path)
        for batch in trainer.data.valid_batches():
            for row in batch["input_ids"]:
                ids = [t for t in row[:prompt_tokens].tolist() if t != tokenizer.bos_id]
                prompts.append(tokenizer.decode(ids))
                if len(prompts) == count:
                    return prompts
    return prompts
