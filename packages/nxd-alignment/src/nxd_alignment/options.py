"""The options under ``model_alignment_strategy.dpo`` / ``.orpo`` (NxDT's key names), checked
before launch; every key is honoured or refused with the reason."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nxd.errors import ConfigError
from nxd_alignment.losses import DPO_LOSS_TYPES

TRUNCATION_MODES = ("keep_start", "keep_end")


def _number(options: dict, key: str, where: str, default: float) -> float:
    value = options.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ConfigError(f"{where}.{key} must be a positive number, got {value!r}")
    return float(value)


#: NxDT's earlier name of max_prompt_length (its DPO configs up to release 2.22 wrote max_dpo_prompt_length)
EARLIER_MAX_PROMPT = "max_dpo_prompt_length"


def _common(options: dict, where: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if EARLIER_MAX_PROMPT in options:
        earlier = options.pop(EARLIER_MAX_PROMPT)
        if "max_prompt_length" in options and options["max_prompt_length"] != earlier:
            raise ConfigError(f"{where}: {EARLIER_MAX_PROMPT}={earlier} (NxD Training's earlier name of "
                              f"max_prompt_length) and max_prompt_length={options['max_prompt_length']} disagree; "
                              "keep max_prompt_length")
        options["max_prompt_length"] = earlier
    if "max_prompt_length" in options:
        value = options["max_prompt_length"]
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ConfigError(f"{where}.max_prompt_length must be a positive integer, got {value!r}")
        out["max_prompt_length"] = value
    mode = options.get("truncation_mode", "keep_start")
    if mode not in TRUNCATION_MODES:
        raise ConfigError(f"{where}.truncation_mode={mode!r}: valid values are {', '.join(TRUNCATION_MODES)}")
    out["truncation_mode"] = mode
    return out


def _unknown(options: dict, known: set[str], where: str) -> None:
    extra = sorted(set(options) - known)
    if extra:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(extra)}; valid: {', '.join(sorted(known))}")


@dataclass(frozen=True)
class DPOOptions:
    beta: float
    loss_type: str
    precompute_ref_log_probs: bool
    data_options: dict[str, Any]

    @classmethod
    def parse(cls, options: dict[str, Any] | None) -> DPOOptions:
        where, options = "model_alignment_strategy.dpo", dict(options or {})
        _unknown(options, {"kl_beta", "beta", "loss_type", "max_prompt_length", EARLIER_MAX_PROMPT,
                           "precompute_ref_log_probs", "truncation_mode"}, where)
        if "kl_beta" in options and "beta" in options and options["kl_beta"] != options["beta"]:
            raise ConfigError(f"{where}: kl_beta={options['kl_beta']} and beta={options['beta']} disagree; set one")
        beta = _number(options, "kl_beta" if "kl_beta" in options else "beta", where, 0.1)
        loss_type = options.get("loss_type", "sigmoid")
        if loss_type not in DPO_LOSS_TYPES:
            raise ConfigError(f"{where}.loss_type={loss_type!r}: supported: {', '.join(DPO_LOSS_TYPES)} (TRL's "
                              "definitions)")
        precompute = options.get("precompute_ref_log_probs", True)
        if not isinstance(precompute, bool):
            raise ConfigError(f"{where}.precompute_ref_log_probs must be true or false, got {precompute!r}")
        return cls(beta, loss_type, precompute, _common(options, where))


@dataclass(frozen=True)
class ORPOOptions:
    beta: float
    data_options: dict[str, Any]

    @classmethod
    def parse(cls, options: dict[str, Any] | None) -> ORPOOptions:
        where, options = "model_alignment_strategy.orpo", dict(options or {})
        _unknown(options, {"beta", "max_prompt_length", "truncation_mode"}, where)
        return cls(_number(options, "beta", where, 0.1), _common(options, where))
