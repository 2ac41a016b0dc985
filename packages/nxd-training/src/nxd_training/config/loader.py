"""Read a YAML config (a file or ``hub:<name>``), apply overrides, validate it completely."""

from __future__ import annotations

from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from nxd import ConfigError
from nxd_training.config.errors import config_error, suggest
from nxd_training.config.overrides import apply_overrides, resolve_interpolations
from nxd_training.config.schema import TrainingConfig

HUB_PREFIX = "hub:"


def hub_names() -> list[str]:
    """Names of the configs shipped in ``nxd_training/hub`` (``nxd train hub:<name>``)."""
    folder = resources.files("nxd_training") / "hub"
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


def hub_path(name: str) -> Path:
    names = hub_names()
    if name not in names:
        raise ConfigError(f"no hub config named {name!r}{suggest(name, names)}; available: {', '.join(names)}")
    return Path(str(resources.files("nxd_training") / "hub" / f"{name}.yaml"))


def read_yaml(source: str | Path) -> dict[str, Any]:
    """The raw mapping in a YAML file; ``hub:<name>`` reads a shipped config."""
    text_source = str(source)
    path = hub_path(text_source[len(HUB_PREFIX):]) if text_source.startswith(HUB_PREFIX) else Path(source)
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist (hub configs: {', '.join(hub_names())})")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ConfigError(f"{path}: not valid YAML{where}: {getattr(exc, 'problem', exc)}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections, got {type(data).__name__}")
    return data


def parse_config(raw: dict[str, Any], overrides: Sequence[str] = (), source: str = "config") -> TrainingConfig:
    """Schema-level validation only (types, ranges, unknown keys); see :func:`load_config`."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: the top level must be a mapping of sections, got {type(raw).__name__}")
    bad = [k for k in raw if not isinstance(k, str)]
    if bad:
        raise ConfigError(f"{source}: keys must be strings, got {bad[0]!r}")
    merged = resolve_interpolations(apply_overrides(raw, overrides))
    try:
        return TrainingConfig.model_validate(merged)
    except ValidationError as exc:
        raise config_error(TrainingConfig, exc, source) from None
    except (TypeError, ValueError, KeyError, AttributeError) as exc:  # odd YAML shapes pydantic did not expect
        raise ConfigError(f"invalid {source}: {exc}") from None


def load_config(source: str | Path | dict[str, Any], overrides: Sequence[str] = (), check: bool = True) -> TrainingConfig:
    """Load and validate the whole config: schema, cross-field rules, and every plugin it needs
    (model, data module, pipeline, ZeRO-1, LoRA) — all before any process starts."""
    if isinstance(source, dict):
        raw, name = source, "config"
    else:
        raw, name = read_yaml(source), str(source)
    config = parse_config(raw, overrides, name)
    if check:
        from nxd_training.config.plan import make_plan

        make_plan(config)
    return config


def dump_config(config: TrainingConfig) -> str:
    """The validated config as YAML (written into every run directory)."""
    data = config.model_dump(mode="json", by_alias=True, exclude_none=False)
    return yaml.safe_dump(data, sort_keys=False)
