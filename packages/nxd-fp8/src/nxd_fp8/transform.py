"""The ``fp8`` model transform (slot ``low_precision``: after the parallel layers exist, before
adapters, activation checkpointing, compile, the pipeline split and the data-parallel strategy)."""

from __future__ import annotations

import logging
from typing import Any

import torch

from nxd import ConfigError
from nxd.run_config import RunConfig
from nxd.transforms import ModelTransform, When
from nxd_fp8.options import NAME, Fp8Options, parse_options
from nxd_fp8.support import default_device_type, fp8_refusal

log = logging.getLogger(__name__)


def options_of(nxd_config: dict) -> Fp8Options | None:
    """The ``fp8`` options of a config (``None``: FP8 is off)."""
    raw = RunConfig.of(nxd_config).transform_options(NAME)
    return None if raw is None else parse_options(raw)


def check_device(options: Fp8Options, device_type: str | None = None) -> None:
    """Refuse FP8 on a device that has no FP8 matmul (the options' device, else ``device_type``,
    else this process's accelerator)."""
    device = options.device or device_type or default_device_type()
    reason = fp8_refusal(device, options.recipe, options.emulate)
    if reason:
        raise ConfigError(f"model_transforms['fp8'] (precision.type: fp8): {reason}")


def _device_of(model: torch.nn.Module, context: Any) -> str | None:
    for p in model.parameters():
        if not p.is_meta:
            return p.device.type
    device = getattr(context, "device", None)  # meta-initialised: the device the context trains on
    return None if device is None else torch.device(device).type


def _apply(model: torch.nn.Module, context: Any, nxd_config: dict) -> torch.nn.Module:
    from nxd_fp8.convert import convert_to_fp8  # torchao is imported only when FP8 is on

    options = options_of(nxd_config)
    check_device(options, None if options.device else _device_of(model, context))
    model, report = convert_to_fp8(model, options)
    if not report.converted:
        skipped = "; ".join(f"{k}: {v}" for k, v in report.skipped.items()) or "the model has no linear layer"
        raise ConfigError(f"model_transforms['fp8'] (precision.type: fp8): no linear layer of this model can run in "
                          f"FP8, so FP8 would change nothing ({skipped})")
    log.info("fp8 (%s%s): %d linear layers in FP8, %d kept in high precision", options.recipe,
             ", emulated" if options.emulate else "", len(report.converted), len(report.skipped))
    model.fp8_report = report  # what was converted, for the trainer's summary and tests
    return model


FP8_TRANSFORM = ModelTransform(NAME, "low_precision", _apply, When("model_transforms", contains=NAME),
                               description="FP8 linear layers through torchao's float8 training (tensorwise/rowwise)")
