"""Load a YAML config (a file or ``hub:<name>``), apply overrides, validate it completely."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from nxd import ConfigError
from nxd_training.config.compose import hub_names, hub_path, read_yaml, resolve
from nxd_training.config.errors import config_error
from nxd_training.config.schema import TrainingConfig

__all__ = ["dump_config", "hub_names", "hub_path", "load_config", "parse_config", "read_yaml"]


def parse_config(raw: dict[str, Any], overrides: Sequence[str] = (), source: str = "config") -> TrainingConfig:
    """Schema-level validation only (types, ranges, unknown keys) of the OmegaConf-resolved config;
    see :func:`load_config`."""
    resolved = resolve(raw, overrides, source)
    try:
        return TrainingConfig.model_validate(resolved)
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
