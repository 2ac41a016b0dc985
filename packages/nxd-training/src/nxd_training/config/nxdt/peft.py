"""``model_alignment_strategy.peft``: NxD's ``LoraConfig`` (nxd-lora) with NxDT's YAML defaults.

The fields, their checks and NxD's defaults are ``LoraConfig``'s, written once in nxd-lora; the YAML
section is a mapping of those fields. What NxDT adds is stated here once: its spelling of one field
and the defaults its model builds pass where they differ from NxD's (NxDT's
``LoraConfig(lora_alpha=cfg.get('lora_alpha', 32), lora_dropout=cfg.get('lora_dropout', 0.05), ...)``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from nxd import ConfigError

KEY = "model_alignment_strategy.peft"
#: NxDT's YAML name -> the LoraConfig field
NXDT_PEFT_RENAMES: dict[str, str] = {"lora_bias": "bias"}
#: NxDT's defaults where they differ from NxD's LoraConfig (lora_alpha 8.0, lora_dropout 0.0,
#: save_lora_config_adapter False, merge_sharded_lora True there)
NXDT_PEFT_DEFAULTS: dict[str, Any] = {"lora_alpha": 32.0, "lora_dropout": 0.05, "save_lora_config_adapter": True,
                                      "merge_sharded_lora": False}
#: set by the run itself: enable_lora (the section's presence), lora_verbose (the trainer prints the
#: trainable count once, on rank 0), base_model_name_or_path/extra (written by the export)
RUN_OWNED = ("enable_lora", "lora_verbose", "base_model_name_or_path", "extra")


def lora_config(section: dict[str, Any], default_targets: list[str]) -> Any:
    """The ``LoraConfig`` of a ``peft`` section; ``target_modules`` unset: the model's default targets
    (NxDT's ``["qkv_proj"]`` names only its Llama module). Unknown keys and bad values are a
    :class:`ConfigError` naming ``model_alignment_strategy.peft.<key>``."""
    try:
        from nxd_lora import LoraConfig
    except ImportError:
        raise ConfigError(f"{KEY} needs LoRA: pip install nxd-lora") from None
    fields = {f.name for f in dataclasses.fields(LoraConfig)} - set(RUN_OWNED)
    valid = sorted((fields - set(NXDT_PEFT_RENAMES.values())) | set(NXDT_PEFT_RENAMES) | {"lora_verbose"})
    values = dict(NXDT_PEFT_DEFAULTS)
    for key, value in (section or {}).items():
        name = NXDT_PEFT_RENAMES.get(key, key)
        if key not in valid:
            from nxd_training.config.errors import suggest

            raise ConfigError(f"{KEY}.{key}: unknown key{suggest(key, valid)}; valid keys: {', '.join(valid)}")
        if name != "lora_verbose":
            values[name] = value
    if not values.get("target_modules"):
        values["target_modules"] = list(default_targets) or None
    try:
        return LoraConfig(**values, enable_lora=True, lora_verbose=False)
    except ConfigError as exc:
        raise ConfigError(f"{KEY}: {str(exc).replace('LoraConfig.', '')}") from None
