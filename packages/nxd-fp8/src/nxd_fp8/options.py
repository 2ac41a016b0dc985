"""The ``fp8`` transform's options (``neuronx_distributed_config(model_transforms={"fp8": {...}})``,
YAML ``precision.fp8``), validated in one place."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from nxd import ConfigError

NAME = "fp8"
#: torchao's float8 training recipes (``Float8LinearRecipeName``)
RECIPES = ("tensorwise", "rowwise", "rowwise_with_gw_hp")
#: module names kept in high precision by default: the LM heads of nxd's families and torchtitan's
#: (``output``); the head's logits feed the loss directly, where FP8's error is largest
DEFAULT_SKIPPED = ("lm_head", "output", "output_layer")


@dataclass(frozen=True)
class Fp8Options:
    #: torchao recipe: ``tensorwise`` (fastest), ``rowwise``, ``rowwise_with_gw_hp`` (most accurate)
    recipe: str = "tensorwise"
    #: module names (the last component of a module's qualified name) left in high precision
    skip_modules: tuple[str, ...] = DEFAULT_SKIPPED
    #: torchao's emulation: FP8 rounding done in high precision on any device, no speed-up (tests, debugging)
    emulate: bool = False
    #: device type the model trains on (``nxd train`` sets it); unset: the current accelerator, else cpu
    device: str | None = None


FIELDS = tuple(f.name for f in dataclasses.fields(Fp8Options))


def parse_options(raw: Any, where: str = "model_transforms['fp8']") -> Fp8Options:
    """Validate ``raw`` (``True``/``{}`` for the defaults, or a dict of :class:`Fp8Options` fields)."""
    if raw is True or raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{where} must be a dict of {', '.join(FIELDS)} (or true), got {raw!r}")
    unknown = sorted(set(raw) - set(FIELDS))
    if unknown:
        raise ConfigError(f"{where}: unknown option(s) {', '.join(unknown)}; known: {', '.join(FIELDS)}")
    recipe = raw.get("recipe", Fp8Options.recipe)
    if recipe not in RECIPES:
        raise ConfigError(f"{where}.recipe={recipe!r}: torchao's float8 recipes are {', '.join(RECIPES)}")
    skip = raw.get("skip_modules", DEFAULT_SKIPPED)
    if isinstance(skip, str) or not all(isinstance(s, str) and s for s in skip):
        raise ConfigError(f"{where}.skip_modules must be a list of module names, got {skip!r}")
    emulate = raw.get("emulate", False)
    if not isinstance(emulate, bool):
        raise ConfigError(f"{where}.emulate must be true or false, got {emulate!r}")
    device = raw.get("device")
    if device is not None and not isinstance(device, str):
        raise ConfigError(f"{where}.device must be a device type such as 'cuda', got {device!r}")
    return Fp8Options(recipe=recipe, skip_modules=tuple(skip), emulate=emulate, device=device)
