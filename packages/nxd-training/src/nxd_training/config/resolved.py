"""A resolved run on disk, and the live objects its RunConfig names.

``nxd train`` resolves the YAML (+ overrides) exactly once (``resolve_config``) into the sections
(every choice explicit: ``model.architecture`` names the model the run builds) carrying the run's
:class:`nxd.run_config.RunConfig` (``config.run``; ``run.derived``: the model config, the batch
numbers, the data section, the workflow). ``--validate`` and ``--print-config`` show it; the
launcher writes it once to ``<run>/config.yaml`` (the sections, then the RunConfig's record under
``resolved``); every rank reads that file back with :func:`load_resolved`, which deserialises and
never resolves again, so validation and the ranks cannot disagree.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

import nxd
from nxd import ComponentNotFound, ConfigError
from nxd.run_config import RunConfig
from nxd_training.config.schema import TrainingConfig

#: the top-level key of a written config that holds the RunConfig's record
RESOLVED_KEY = "resolved"
#: the key of that record holding the digest of the sections it was resolved from
DIGEST_KEY = "sections_sha256"


def sections_digest(sections: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(sections, sort_keys=True, default=str).encode()).hexdigest()


def dump_resolved(config: TrainingConfig) -> str:
    """The resolved config as YAML: the sections (every key, nulls included), then ``resolved``."""
    data = config.model_dump(mode="json", by_alias=True, exclude_none=False)
    record = {**config.run.to_record(), DIGEST_KEY: sections_digest(data)}
    return yaml.safe_dump({**data, RESOLVED_KEY: record}, sort_keys=False)


def model_spec_of(run: RunConfig) -> Any:
    """The registered model (``nxd.specs.ModelSpec``) the resolution chose."""
    try:
        return nxd.get_component("model", run.derived.architecture, need=run.derived.architecture_reason)
    except ComponentNotFound as exc:
        raise ConfigError(str(exc)) from None


def model_config_of(run: RunConfig, spec: Any, **changes: Any) -> Any:
    """The model plugin's config object the run trains: the recorded model dict, in the run's
    parameter dtype (``run.param_dtype``, when the precision asks for one), ``changes`` applied."""
    dtype = {"dtype": run.param_dtype} if run.param_dtype is not None else {}
    return spec.config_from_dict({**run.derived.model, **dtype, **changes})


def load_resolved(path: str | Path) -> TrainingConfig:
    """Read a run's ``config.yaml`` as written by ``nxd train`` (what every rank does): deserialised, never
    resolved again; its sections must be exactly the ones the resolution was made from."""
    from nxd_training.config.errors import config_error
    from nxd_training.config.features import recompute_table

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
    source = str(path)
    sections = {k: v for k, v in raw.items() if k != RESOLVED_KEY}
    record = raw[RESOLVED_KEY]
    if not isinstance(record, dict) or not isinstance(record.get("derived"), dict):
        raise ConfigError(f"{source}: its '{RESOLVED_KEY}' section is not a run config nxd train wrote (written by an "
                          "older nxd?); run `nxd train` on the run's YAML to resolve it again")
    recorded = record.get(DIGEST_KEY)
    if recorded is not None and recorded != sections_digest(sections):
        raise ConfigError(f"{source}: its sections were edited after `nxd train` resolved them (the '{RESOLVED_KEY}' "
                          "section no longer describes them); run `nxd train` on the edited file to resolve it again")
    try:
        config = TrainingConfig.model_validate(sections)
    except ValidationError as exc:
        raise config_error(TrainingConfig, exc, source) from None
    arch = record["derived"].get("architecture")
    try:
        spec = nxd.get_component("model", arch, need=f"{source}: {RESOLVED_KEY}.derived.architecture")
    except ComponentNotFound as exc:
        raise ConfigError(str(exc)) from None
    # activation-checkpoint classes by name, looked up among the model's own (nothing imported from a file)
    return config.with_run(RunConfig.from_record(record, recompute_table(spec), f"{source}: {RESOLVED_KEY}"))
