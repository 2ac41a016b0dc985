"""The one resolved config of a run.

``nxd train`` resolves the YAML (+ overrides) exactly once into a :class:`ResolvedConfig`: the
config's sections with every choice made explicit (``model.architecture`` names the model the run
builds) plus :class:`Resolution`, what was derived from them and from the files they name (the
model config handed to the model plugin, the parallel layout, the data module, the workflow).
``--validate`` and ``--print-config`` show that object; the launcher writes it once to
``<run>/config.yaml``; every rank reads that file back with :func:`load_resolved`, which
deserialises and never resolves again, so validation and the ranks cannot disagree.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from nxd import ConfigError
from nxd_training.config.schema import TrainingConfig

#: the top-level key of a written config that holds the resolution
RESOLVED_KEY = "resolved"


class Resolution(BaseModel):
    """What ``nxd train`` derived from the sections (nothing here is re-derived on a rank)."""

    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=())

    architecture: str = Field(description="the registered model (nxd.get_model) this run builds")
    architecture_reason: str = Field(description="which key chose it (model.architecture, model_source, ...)")
    model: dict[str, Any] = Field(description="the model plugin's config_from_dict input: Hugging Face keys, the "
                                              "model_config file, the tokenizer's vocabulary, the feature keys set")
    world_size: int
    tp: int
    pp: int
    dp: int
    cp: int
    ep: int
    num_microbatches: int
    seq_length: int
    data_module: str
    workflow: Union[str, None] = Field(None, description="model_alignment_strategy's workflow (dpo, orpo), or null")
    #: the core's RunConfig (nxd.run_config.RunConfig.to_record): what every rank builds and trains with
    run: Union[dict[str, Any], None] = None
    #: how keys of earlier NxDT releases, and keys accepted without effect here, were read
    notes: list[str] = Field(default_factory=list)
    #: sha256 of the sections as written; a rank refuses a file whose sections were edited afterwards
    sections_sha256: Union[str, None] = None


class ResolvedConfig(TrainingConfig):
    """A :class:`TrainingConfig` resolved once, carrying its :class:`Resolution`. Built by
    :func:`nxd_training.config.resolve_config`; read back on ranks by :func:`load_resolved`."""

    resolved: Resolution


def sections_digest(sections: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(sections, sort_keys=True, default=str).encode()).hexdigest()


def dump_resolved(config: ResolvedConfig) -> str:
    """The resolved config as YAML: the sections (every key, nulls included), then ``resolved``."""
    data = config.model_dump(mode="json", by_alias=True, exclude_none=False)
    resolution = data.pop(RESOLVED_KEY)
    resolution["sections_sha256"] = sections_digest(data)
    return yaml.safe_dump({**data, RESOLVED_KEY: resolution}, sort_keys=False)


def resolved_from_mapping(raw: dict[str, Any], source: str) -> ResolvedConfig:
    """Deserialise a written resolved config (no resolution): the sections must be exactly the ones
    the resolution was made from."""
    from nxd_training.config.errors import config_error

    sections = {k: v for k, v in raw.items() if k != RESOLVED_KEY}
    recorded = (raw.get(RESOLVED_KEY) or {}).get("sections_sha256") if isinstance(raw.get(RESOLVED_KEY), dict) else None
    if recorded is not None and recorded != sections_digest(sections):
        raise ConfigError(f"{source}: its sections were edited after `nxd train` resolved them (the '{RESOLVED_KEY}' "
                          "section no longer describes them); run `nxd train` on the edited file to resolve it again")
    try:
        return ResolvedConfig.model_validate(raw)
    except ValidationError as exc:
        raise config_error(ResolvedConfig, exc, source) from None


def load_resolved(path: str | Path) -> ResolvedConfig:
    """Read a run's ``config.yaml`` as written by ``nxd train`` (what every rank does)."""
    path = Path(path)
    try:
        # libyaml's safe loader when PyYAML has it: the pure-Python one takes ~0.3 s per rank here
        raw = yaml.load(path.read_text(encoding="utf-8"), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file (a run directory's config.yaml, written by `nxd train`)") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({exc.__class__.__name__})") from None
    if not isinstance(raw, dict) or RESOLVED_KEY not in raw:
        raise ConfigError(f"{path}: not a resolved config (no '{RESOLVED_KEY}' section); ranks read the config.yaml "
                          "that `nxd train` writes into the run directory, never a hand-written YAML")
    return resolved_from_mapping(raw, str(path))
