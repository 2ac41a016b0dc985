"""``precision.type`` (NxDT's names) and what each one means: the one place these facts live."""

from __future__ import annotations

from typing import Any

import torch

from nxd.dtypes import DTYPE_NAMES
from nxd.errors import ConfigError

#: every ``precision.type`` nxd accepts (NxDT's names)
PRECISION_TYPES = ("fp32", "autocast", "bf16SR", "mixed_precision", "mixed_precisionSR", "mixed_precision_SR", "manual",
                   "fp8")
#: types whose forward passes run under bf16 autocast (``fp8``, an nxd addition: autocast, with the
#: linear layers' matmuls in FP8 through nxd-fp8's ``fp8`` model transform)
AUTOCAST_TYPES = ("autocast", "fp8")
#: the model transform ``precision.type: fp8`` turns on, and the distribution that provides it
FP8_TRANSFORM, FP8_DISTRIBUTION = "fp8", "nxd-fp8"
#: types whose parameters are bf16
BF16_PARAM_TYPES = ("bf16SR", "mixed_precision", "mixed_precisionSR", "mixed_precision_SR")
#: types that round bf16 updates stochastically
STOCHASTIC_ROUNDING_TYPES = ("bf16SR", "mixed_precisionSR", "mixed_precision_SR")


def uses_master_weights(precision: Any) -> bool:
    """``precision.master_weights``, defaulting to on for the ``mixed_precision*`` types."""
    if precision.master_weights is not None:
        return bool(precision.master_weights)
    return precision.type.startswith("mixed_precision")


def check_precision(p: Any, ds: Any) -> tuple[str, str, str, str] | None:
    """The ``precision`` section against ``distributed_strategy`` (``ds``): FP8 options need the FP8 type,
    master weights live in the ZeRO-1 optimizer (not FSDP's). Returns what the type needs installed, as
    ``(component kind, name, the key asking, the distribution)``, or None."""
    if p.fp8 is not None and p.type != "fp8":
        raise ConfigError(f"precision.fp8 holds FP8 options, and precision.type={p.type}: set precision.type=fp8 "
                          "to train with FP8, or remove precision.fp8")
    if uses_master_weights(p) and ds.fsdp:
        raise ConfigError(
            f"precision.type={p.type} keeps fp32 master weights in the ZeRO-1 optimizer; with distributed_strategy.fsdp "
            "the sharded parameters are the fp32 master: use precision.type fp32 and distributed_strategy.fsdp."
            "mixed_precision {param_dtype: bf16, reduce_dtype: fp32}"
        )
    if uses_master_weights(p) and not ds.zero1:
        raise ConfigError(
            f"precision.type={p.type} keeps fp32 master weights, which live in the ZeRO-1 optimizer: set "
            "distributed_strategy.zero1=true (or use precision.type fp32/autocast/bf16SR)"
        )
    return ("model_transform", FP8_TRANSFORM, "precision.type=fp8", FP8_DISTRIBUTION) if p.type == "fp8" else None


def model_transforms(precision: Any, trainer: Any) -> dict[str, dict] | None:
    """The model transforms the precision type turns on (``fp8``: nxd-fp8's, with ``precision.fp8``'s
    options and the device the ranks train on (``trainer.accelerator``), so a device without FP8
    matmuls is refused before launch)."""
    if precision.type != "fp8":
        return None
    from nxd_training.runtime import select_backend

    backend = select_backend(trainer)
    device = torch.accelerator.current_accelerator().type if backend == "accelerator" else backend
    return {FP8_TRANSFORM: {**(precision.fp8 or {}), "device": device}}


def parallel_layers_reduce_dtype(precision: Any) -> torch.dtype:
    """The dtype the tensor-parallel layers sum their partial results in (NxDT's rule): an ``fp32``
    run reduces in ``precision.parallel_layers_reduce_dtype`` (fp32 unless set), every other type in
    bf16 unless that key asks for fp32."""
    name = precision.parallel_layers_reduce_dtype or ("fp32" if precision.type == "fp32" else "bf16")
    return DTYPE_NAMES[name]

