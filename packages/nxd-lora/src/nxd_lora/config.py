"""``LoraConfig``: NxD's LoRA settings, checked field by field when created."""

from __future__ import annotations

import math
import numbers
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from nxd.errors import ConfigError
from nxd_lora.quantize import QUANTIZE_MODES

BIAS_MODES = ("none", "all", "lora_only")
INIT_MODES = ("default", "gaussian")


@dataclass
class LoraConfig:
    """LoRA settings with NxD's field names (``neuronx_distributed.modules.lora.LoraConfig``).

    ``target_modules``: module names (Hugging Face/PEFT names such as ``"q_proj"``, or nxd names
    such as ``"qkv_proj"`` for all of q/k/v) matched against the end of a module's dotted name, or a
    regex string matched against the whole name. ``None`` uses the model spec's default targets.
    """

    #: NxD since 2.21 applies LoRA whenever a LoraConfig is given (it dropped this field); NxD 2.19-2.20
    #: scripts pass it explicitly, and ``False`` still leaves the model unadapted
    enable_lora: bool = True
    lora_rank: int = 16
    lora_alpha: float = 8.0
    lora_dropout: float = 0.0
    bias: str = "none"
    target_modules: list[str] | str | None = None
    use_rslora: bool = False
    init_lora_weights: str = "default"
    modules_to_save: list[str] | None = None
    lora_verbose: bool = False
    save_lora_base: bool = False
    merge_lora: bool = False
    save_lora_config_adapter: bool = False
    load_lora_from_ckpt: bool = False
    lora_save_dir: str = "lora_adapter"
    lora_load_tag: str | None = None
    merge_sharded_lora: bool = True
    #: written as ``base_model_name_or_path`` in ``adapter_config.json`` (PEFT needs it to auto-load)
    base_model_name_or_path: str | None = None
    #: QLoRA (nxd's addition, not NxD's): ``"nf4"`` stores each LoRA target's frozen base weight as
    #: torchao's ``NF4Tensor``; ``None`` keeps it as it is
    quantize_base: str | None = None
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        for name in ("enable_lora", "use_rslora", "lora_verbose", "save_lora_base", "merge_lora",
                     "save_lora_config_adapter", "load_lora_from_ckpt", "merge_sharded_lora"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"LoraConfig.{name} must be True or False, got {getattr(self, name)!r}")
        rank = self.lora_rank
        if isinstance(rank, bool) or not isinstance(rank, numbers.Integral) or rank < 1:
            raise ConfigError(f"LoraConfig.lora_rank must be a positive integer, got {rank!r}")
        self.lora_rank = int(rank)
        alpha = self.lora_alpha
        if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real) or not math.isfinite(alpha) or alpha <= 0:
            raise ConfigError(f"LoraConfig.lora_alpha must be a positive number, got {alpha!r}")
        drop = self.lora_dropout
        if isinstance(drop, bool) or not isinstance(drop, numbers.Real) or not 0.0 <= drop < 1.0:
            raise ConfigError(f"LoraConfig.lora_dropout must be a number in [0, 1), got {drop!r}")
        if self.bias not in BIAS_MODES:
            raise ConfigError(f"LoraConfig.bias must be one of {', '.join(BIAS_MODES)}, got {self.bias!r}")
        if self.init_lora_weights not in INIT_MODES:
            raise ConfigError(
                f"LoraConfig.init_lora_weights must be one of {', '.join(INIT_MODES)}, got {self.init_lora_weights!r}"
            )
        self.target_modules = _check_targets(self.target_modules)
        if self.modules_to_save:
            raise ConfigError("LoraConfig.modules_to_save is not supported by nxd-lora yet; leave it None")
        if self.merge_lora and not self.save_lora_base:
            raise ConfigError("LoraConfig.merge_lora=True needs save_lora_base=True (the merged base is what is saved)")
        if not isinstance(self.lora_save_dir, str) or not self.lora_save_dir:
            raise ConfigError(f"LoraConfig.lora_save_dir must be a non-empty path string, got {self.lora_save_dir!r}")
        if self.quantize_base is not None and self.quantize_base not in QUANTIZE_MODES:
            raise ConfigError(f"LoraConfig.quantize_base must be None or one of {', '.join(QUANTIZE_MODES)}, "
                              f"got {self.quantize_base!r}")
        if self.quantize_base is not None and self.save_lora_base:
            raise ConfigError("LoraConfig.quantize_base with save_lora_base=True is not supported: the base is stored "
                              "as NF4 codes; save the adapter and apply it to the original base (as PEFT's QLoRA does)")
        if self.lora_load_tag is not None and not isinstance(self.lora_load_tag, str):
            raise ConfigError(f"LoraConfig.lora_load_tag must be a string or None, got {self.lora_load_tag!r}")

    @property
    def scaling(self) -> float:
        """``alpha / r``, or ``alpha / sqrt(r)`` with rank-stabilised LoRA."""
        r = math.sqrt(self.lora_rank) if self.use_rslora else self.lora_rank
        return float(self.lora_alpha) / r

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("extra")
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LoraConfig:
        known = set(cls.__dataclass_fields__) - {"extra"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"LoraConfig has no field(s) {unknown}; valid fields: {', '.join(sorted(known))}")
        return cls(**data)


def _check_targets(targets: Any) -> list[str] | str | None:
    if targets is None:
        return None
    if isinstance(targets, str):
        try:
            re.compile(targets)
        except re.error as err:
            raise ConfigError(f"LoraConfig.target_modules is not a valid regex {targets!r}: {err}") from None
        return targets
    if isinstance(targets, (list, tuple, set)):
        items = list(targets)
        bad = [t for t in items if not isinstance(t, str) or not t]
        if bad or not items:
            raise ConfigError(
                f"LoraConfig.target_modules must be a non-empty list of module names (e.g. ['q_proj', 'v_proj']) "
                f"or a regex string, got {targets!r}"
            )
        return items
    raise ConfigError(f"LoraConfig.target_modules must be a list of module names or a regex string, got {targets!r}")
