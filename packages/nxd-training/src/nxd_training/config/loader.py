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
from nxd_training.config.legacy import lift_alignment
from nxd_training.config.resolved import RESOLVED_KEY, ResolvedConfig, dump_resolved
from nxd_training.config.schema import TrainingConfig

__all__ = ["dump_config", "hub_names", "hub_path", "load_config", "parse_config", "read_yaml"]


def parse_config(raw: dict[str, Any], overrides: Sequence[str] = (), source: str = "config") -> TrainingConfig:
    """Schema-level validation only (types, ranges, unknown keys) of the OmegaConf-resolved config;
    see :func:`load_config`. A written run config's ``resolved`` section is dropped: the sections
    are the source, and resolving them again is :func:`load_config`'s job."""
    if isinstance(raw, dict) and RESOLVED_KEY in raw:
        raw = {k: v for k, v in raw.items() if k != RESOLVED_KEY}
    resolved = resolve(raw, overrides, source)
    try:
        config = TrainingConfig.model_validate(resolved)
    except ValidationError as exc:
        raise config_error(TrainingConfig, exc, source) from None
    except (TypeError, ValueError, KeyError, AttributeError) as exc:  # odd YAML shapes pydantic did not expect
        raise ConfigError(f"invalid {source}: {exc}") from None
    return lift_alignment(config)  # NxDT's earlier data.alignment_strategy, read where later releases put it


def load_config(source: str | Path | dict[str, Any], overrides: Sequence[str] = (),
                check: bool = True) -> TrainingConfig:
    """Load and validate the whole config: schema, cross-field rules, and every plugin it needs
    (model, data module, pipeline, ZeRO-1, LoRA) — all before any process starts. With ``check``
    (the default) the result is the :class:`ResolvedConfig` (resolved once, here); without it, the
    schema-checked sections only (``nxd train`` resolves them after data preparation)."""
    if isinstance(source, dict):
        raw, name = source, "config"
    else:
        raw, name = read_yaml(source), str(source)
    config = parse_config(raw, overrides, name)
    if check:
        from nxd_training.config.plan import resolve_config

        return resolve_config(config)
    return config


def dump_config(config: TrainingConfig) -> str:
    """The config as YAML: a :class:`ResolvedConfig` with its ``resolved`` section (what every run
    directory holds and every rank reads), else the sections alone."""
    if isinstance(config, ResolvedConfig):
        return dump_resolved(config)
    data = config.model_dump(mode="json", by_alias=True, exclude_none=False)
    return yaml.safe_dump(data, sort_keys=False)
