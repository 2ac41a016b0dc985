"""``model.pretrained_checkpoint``: start a run from a Hugging Face model folder's weights.

Checked before launch (the folder, its weights, its ``config.json`` against the model section);
each rank then loads its slices through the model plugin's ``ModelSpec.load_hf`` and the
optimizer starts fresh. A run that already has checkpoints of its own resumes from them instead.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from nxd.errors import ConfigError
from nxd_training.config.plan import MODEL_KEY_MAP, RunPlan
from nxd_training.config.schema import ModelConfig, TrainingConfig

KEY = "model.pretrained_checkpoint"


def looks_like_hf_folder(path: Path) -> bool:
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))


def looks_like_nxd_checkpoint(path: Path) -> bool:
    return any((path / name).exists() for name in ("done", "checkpoint", "model", "checkpoints", "metadata.json"))


def check_pretrained(config: TrainingConfig, plan: RunPlan) -> None:
    """Refuse, naming the field, a pretrained folder the run could not start from."""
    source = config.model.pretrained_checkpoint
    if not source:
        return
    if "://" in source:
        raise ConfigError(f"{KEY}={source}: give a local Hugging Face model folder (download it first, e.g. "
                          "huggingface-cli download NAME --local-dir DIR)")
    if config.exp_manager.resume_from_checkpoint:
        raise ConfigError(f"{KEY} and exp_manager.resume_from_checkpoint are both set: start from the Hugging Face "
                          "weights or from an nxd checkpoint, not both")
    path = Path(source)
    if not path.is_dir():
        raise ConfigError(f"{KEY}: {path} is not a directory (give a Hugging Face model folder: config.json + "
                          "*.safetensors)")
    if not looks_like_hf_folder(path):
        if looks_like_nxd_checkpoint(path):
            raise ConfigError(f"{KEY}: {path} is an nxd checkpoint, not a Hugging Face folder; to start from its "
                              "weights use exp_manager.resume_from_checkpoint=<dir>/<tag> with model.weight_init_only=true")
        found = "pytorch_model.bin only; save it as safetensors (model.save_pretrained(dir, safe_serialization=True))" \
            if any(path.glob("pytorch_model*.bin")) else "no config.json and *.safetensors"
        raise ConfigError(f"{KEY}: {path} holds {found}")
    if getattr(plan.spec, "load_hf", None) is None:
        raise ConfigError(f"{KEY}: model.architecture={plan.spec.name!r} cannot load Hugging Face weights (its "
                          "ModelSpec has no load_hf)")
    hf = json.loads((path / "config.json").read_text(encoding="utf-8"))
    model_type = hf.get("model_type")
    types = tuple(getattr(plan.spec, "hf_model_types", ()) or ()) or (plan.spec.name,)
    if model_type and model_type not in types:
        raise ConfigError(f"{KEY}: {path}/config.json has model_type {model_type!r}, which model.architecture="
                          f"{plan.spec.name!r} does not build (it builds {', '.join(types)})")
    _same_shape(config.model, plan.model_dict, hf, path)


def _same_shape(model: ModelConfig, ours: dict[str, Any], hf: dict[str, Any], path: Path) -> None:
    for key, hf_key in MODEL_KEY_MAP.items():
        if hf_key not in hf or hf_key not in ours or ours[hf_key] == hf[hf_key]:
            continue
        set_here = getattr(model, key, None) is not None
        field = f"model.{key}={ours[hf_key]}" if set_here else f"model.model_config's {hf_key}={ours[hf_key]}"
        raise ConfigError(f"{KEY}: {field} disagrees with {path}/config.json ({hf_key}={hf[hf_key]}); remove the "
                          f"key from the model section (the folder's config.json is the model's) or fix it")

