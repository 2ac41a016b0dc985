"""Command-line overrides (``trainer.max_steps=50``): the key path and the YAML-typed value.

They are merged into the OmegaConf node by :func:`nxd_training.config.loader.compose`."""

from __future__ import annotations

import re
from typing import Any

import yaml

from nxd import ConfigError

_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def parse_override(text: str) -> tuple[list[str], Any]:
    """``"a.b=3"`` -> (["a", "b"], 3): the value is typed by YAML (``50`` int, ``1e-4`` float,
    ``true`` bool, ``[1, 2]`` list, ``null`` None). Hydra's ``+a.b=v`` form is accepted too."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like dotted.key=value (e.g. trainer.max_steps=50)")
    key, raw = text.split("=", 1)
    key = key.strip().lstrip("+")
    if not _KEY.match(key):
        raise ConfigError(f"override {text!r}: {key!r} is not a dotted key like trainer.max_steps")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {text!r}: value is not valid YAML ({exc.__class__.__name__})") from None
    # YAML 1.1 reads 1e-4 as a string; users mean a number.
    if isinstance(value, str):
        try:
            value = float(value) if re.fullmatch(r"[-+]?\d+(\.\d*)?[eE][-+]?\d+", value) else value
        except ValueError:
            pass
    return key.split("."), value
