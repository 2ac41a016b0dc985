"""The ``zero1`` optimizer factory and the checks on its part of the NxD config."""

from __future__ import annotations

from typing import Any

import torch

from nxd import ConfigError, ParallelContext
from nxd.run_config import RunConfig
from nxd.transforms import ModelTransform
from nxd_core_parallel.grads import reduction_param_groups
from nxd_core_parallel.transforms import strategy_selected, wrap_nxd_model
from nxd_zero1.optimizer import NeuronZero1Optimizer

#: NxD's ``mixed_precision_config`` keys (plus nxd's ``stochastic_rounding``) and their defaults
#: when ZeRO-1 is on.
MIXED_PRECISION_DEFAULTS: dict[str, bool] = {
    "use_master_weights": True,
    "use_fp32_grad_acc": True,
    "use_master_weights_in_ckpt": False,
    "stochastic_rounding": False,
}


def validate_mixed_precision(config: dict | None) -> dict[str, bool]:
    """``config`` merged over the defaults; raises ConfigError naming a bad key or value."""
    if config is None:
        return dict(MIXED_PRECISION_DEFAULTS)
    for key, value in config.items():
        if key not in MIXED_PRECISION_DEFAULTS:
            raise ConfigError(f"mixed_precision_config has unknown key {key!r}; valid keys: "
                              f"{', '.join(MIXED_PRECISION_DEFAULTS)}")
        if not isinstance(value, bool):
            raise ConfigError(f"mixed_precision_config.{key} must be True or False, got {value!r}")
    return {**MIXED_PRECISION_DEFAULTS, **config}


def context_groups(context: ParallelContext | None) -> dict[str, Any]:
    """NeuronZero1Optimizer's group arguments for ``context`` (empty without one)."""
    if context is None:
        return {}
    return {"sharding_groups": context.dp.group, "grad_norm_groups": context.tp.group,
            "pipeline_groups": context.pp.group}


def make_zero1_optimizer(nxd_config: dict, optimizer_class: type[torch.optim.Optimizer], parameters: Any,
                         context: ParallelContext | None = None, **defaults: Any) -> NeuronZero1Optimizer:
    """Factory registered as optimizer ``zero1``: builds a NeuronZero1Optimizer from the config,
    sharded over ``context``'s data-parallel group (norms over its TP and PP groups); without a
    context, over the world (NeuronZero1Optimizer's defaults)."""
    nxd_config = RunConfig.of(nxd_config)
    max_norm = nxd_config.optimizer.max_grad_norm  # None: no clipping
    # parameters not replicated over the whole DP group get param groups naming their own groups
    parameters = reduction_param_groups(parameters)
    mp = validate_mixed_precision(nxd_config.mixed_precision_config)
    return NeuronZero1Optimizer(
        parameters,
        optimizer_class,
        grad_clipping=max_norm is not None,  # NeuronZero1Optimizer's (NxD's) arguments
        max_norm=1.0 if max_norm is None else max_norm,
        use_master_weights=mp["use_master_weights"],
        use_fp32_grad_acc=mp["use_fp32_grad_acc"],
        save_master_weights=mp["use_master_weights_in_ckpt"],
        stochastic_rounding=mp["stochastic_rounding"],
        sequence_parallel=nxd_config.sequence_parallel,
        context=context, **{**context_groups(context), **defaults},
    )


#: the ``zero1`` data-parallel strategy: NxD's NxDModel, optimizer state sharded over context.dp
ZERO1_TRANSFORM = ModelTransform("zero1", "data_parallel", wrap_nxd_model, strategy_selected("zero1"),
                                 make_optimizer=make_zero1_optimizer,
                                 description="ZeRO-1: optimizer state and master weights sharded over data parallel")
