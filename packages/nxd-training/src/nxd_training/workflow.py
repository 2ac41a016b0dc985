"""Training workflows chosen by ``model_alignment_strategy`` (``dpo``, ``orpo``, ...).

A key under ``model_alignment_strategy`` other than ``sft`` and ``peft`` names a workflow that a
plugin registers through ``nxd_register_workflows`` (nxd-alignment provides ``dpo`` and ``orpo``).
The trainer only calls the :class:`nxd.specs.Workflow` contract: ``prepare`` once, ``loss`` per
micro-batch; plain pretraining and SFT need no workflow.
"""

from __future__ import annotations

from typing import Any

import nxd
from nxd import ComponentNotFound, ConfigError
from nxd_training.config.schema import ModelAlignmentConfig, TrainingConfig

#: keys of model_alignment_strategy the trainer handles itself
BUILTIN_KEYS = ("sft", "peft")


def workflow_name(align: ModelAlignmentConfig | None) -> str | None:
    """The registered workflow ``model_alignment_strategy`` names (``None``: plain pretraining or SFT)."""
    if align is None:
        return None
    names = [k for k in align.model_dump(exclude_none=True) if k not in BUILTIN_KEYS]
    if len(names) > 1:
        raise ConfigError(f"model_alignment_strategy: choose one workflow, got {', '.join(names)}")
    if names and align.sft is not None:
        raise ConfigError(f"model_alignment_strategy: sft and {names[0]} are different workflows; set one of them")
    return names[0] if names else None


def build_workflow(config: TrainingConfig) -> Any:
    """The workflow object for this config, or ``None``; a missing plugin or a bad option is a
    :class:`nxd.ConfigError` naming the key (and what to install)."""
    name = workflow_name(config.model_alignment_strategy)
    if name is None:
        return None
    key = f"model_alignment_strategy.{name}"
    try:
        factory = nxd.get_workflow(name, need=key)
    except ComponentNotFound as exc:
        raise ConfigError(str(exc)) from None
    options = getattr(config.model_alignment_strategy, name, None)
    try:
        return factory(dict(options or {}))
    except ConfigError:
        raise
    except (TypeError, ValueError, KeyError) as exc:
        raise ConfigError(f"{key}: the {name} workflow rejected its options: {exc}") from None
