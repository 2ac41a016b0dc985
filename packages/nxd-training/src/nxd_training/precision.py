"""``precision.type`` (NxDT's names) and what each one means: the one place these facts live."""

from __future__ import annotations

from typing import Any

import torch

#: every ``precision.type`` nxd accepts (NxDT's names)
PRECISION_TYPES = ("fp32", "autocast", "bf16SR", "mixed_precision", "mixed_precisionSR", "mixed_precision_SR", "manual")
#: types whose parameters are bf16
BF16_PARAM_TYPES = ("bf16SR", "mixed_precision", "mixed_precisionSR", "mixed_precision_SR")
#: types that round bf16 updates stochastically
STOCHASTIC_ROUNDING_TYPES = ("bf16SR", "mixed_precisionSR", "mixed_precision_SR")


def uses_master_weights(precision: Any) -> bool:
    """``precision.master_weights``, defaulting to on for the ``mixed_precision*`` types."""
    if precision.master_weights is not None:
        return bool(precision.master_weights)
    return precision.type.startswith("mixed_precision")


def autocast_dtype(precision: Any) -> torch.dtype | None:
    """The ``torch.autocast`` dtype of the forward passes (``autocast``: bf16), else ``None``."""
    return torch.bfloat16 if precision.type == "autocast" else None
