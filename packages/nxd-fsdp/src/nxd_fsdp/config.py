"""FSDP's part of the config: what ``fsdp_config`` (``neuronx_distributed_config``) and
``distributed_strategy.fsdp`` (YAML) may say, and every combination refused before launch."""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import torch

from nxd import ConfigError
from nxd.dtypes import dtype_name, torch_dtype

KEYS = ("reshard_after_forward", "replicate_degree", "cpu_offload", "mixed_precision")
MIXED_PRECISION_KEYS = ("param_dtype", "reduce_dtype")


@dataclass(frozen=True)
class FsdpConfig:
    """The resolved FSDP settings (``fully_shard``'s arguments, in nxd's words).

    ``reshard_after_forward``: True frees the gathered parameters after each block's forward and
    gathers them again for backward (ZeRO-3); False keeps them until backward (ZeRO-2 memory,
    one all-gather less per block). ``replicate_degree`` > 1 is HSDP: the data-parallel ranks form
    ``replicate_degree`` replicas, each sharding over ``DP / replicate_degree`` ranks.
    ``cpu_offload``: sharded parameters, gradients and optimizer state live in host memory
    (accelerator backends only). ``param_dtype`` / ``reduce_dtype``: the dtype of the gathered
    parameters for compute and of the gradient reduction (None: the parameters' own)."""

    reshard_after_forward: bool = True
    replicate_degree: int = 1
    cpu_offload: bool = False
    param_dtype: str | None = None
    reduce_dtype: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def param_torch_dtype(self) -> torch.dtype | None:
        return torch_dtype(self.param_dtype)

    @property
    def reduce_torch_dtype(self) -> torch.dtype | None:
        return torch_dtype(self.reduce_dtype)


def resolve_fsdp_config(value: Any, field: str = "fsdp_config") -> FsdpConfig | None:
    """``value`` (None/False: off, True: defaults, a mapping of :data:`KEYS`, or an FsdpConfig)
    as an :class:`FsdpConfig`; a ``ConfigError`` naming ``field`` and the bad key otherwise."""
    if value is None or value is False:
        return None
    if value is True:
        return FsdpConfig()
    if isinstance(value, FsdpConfig):
        return value
    if not isinstance(value, Mapping):
        raise ConfigError(f"{field} must be true, false or a mapping with keys {', '.join(KEYS)}; got {value!r}")
    unknown = [k for k in value if k not in KEYS]
    if unknown:
        raise ConfigError(f"{field} has unknown key {unknown[0]!r}; valid keys: {', '.join(KEYS)}")
    reshard = value.get("reshard_after_forward", True)
    if not isinstance(reshard, bool):
        raise ConfigError(f"{field}.reshard_after_forward must be true or false, got {reshard!r}")
    replicate = value.get("replicate_degree", 1)
    if isinstance(replicate, bool) or not isinstance(replicate, numbers.Integral) or replicate < 1:
        raise ConfigError(f"{field}.replicate_degree must be a positive integer, got {replicate!r}")
    offload = value.get("cpu_offload", False)
    if not isinstance(offload, bool):
        raise ConfigError(f"{field}.cpu_offload must be true or false, got {offload!r}")
    mp = value.get("mixed_precision") or {}
    if not isinstance(mp, Mapping):
        raise ConfigError(f"{field}.mixed_precision must be a mapping with keys {', '.join(MIXED_PRECISION_KEYS)}")
    bad = [k for k in mp if k not in MIXED_PRECISION_KEYS]
    if bad:
        raise ConfigError(f"{field}.mixed_precision has unknown key {bad[0]!r}; valid keys: "
                          f"{', '.join(MIXED_PRECISION_KEYS)}")
    return FsdpConfig(reshard_after_forward=reshard, replicate_degree=int(replicate), cpu_offload=offload,
                      param_dtype=dtype_name(mp.get("param_dtype"), f"{field}.mixed_precision.param_dtype"),
                      reduce_dtype=dtype_name(mp.get("reduce_dtype"), f"{field}.mixed_precision.reduce_dtype"))


def refusals(fsdp: FsdpConfig, *, data_parallel_size: int | None, expert_parallel_size: int = 1,
             context_parallel_size: int = 1, zero1: bool = False, accelerator: str | None = None,
             field: str = "fsdp_config") -> list[str]:
    """Every reason ``fsdp`` cannot be honoured with these settings (empty: it can). Checked before
    launch (``data_parallel_size`` None: not known yet, the divisibility check waits for the ranks)."""
    reasons = []
    if zero1:
        reasons.append(f"{field} and optimizer_config.zero_one_enabled (ZeRO-1) are both data-parallel strategies; "
                       "FSDP already shards the optimizer state (and parameters and gradients): choose one")
    if expert_parallel_size > 1 and context_parallel_size > 1:
        reasons.append(f"{field} with expert_parallel_size={expert_parallel_size} and context_parallel_size="
                       f"{context_parallel_size}: expert weights shard over the expert-data-parallel ranks, which "
                       "span context-parallel ranks, and nxd-ckpt writes optimizer state from context-parallel "
                       "rank 0 only, so a checkpoint would lose expert optimizer shards; use one of the two with FSDP")
    if expert_parallel_size > 1 and fsdp.replicate_degree > 1:
        reasons.append(f"{field}.replicate_degree={fsdp.replicate_degree} with expert_parallel_size="
                       f"{expert_parallel_size}: HSDP replicas of the expert weights (a 2-D expert-data-parallel "
                       "mesh) are not built; use replicate_degree 1 (experts and dense weights fully sharded)")
    if data_parallel_size is not None and data_parallel_size % fsdp.replicate_degree:
        reasons.append(f"{field}.replicate_degree={fsdp.replicate_degree} must divide the data-parallel size "
                       f"{data_parallel_size} (HSDP: replicas x shards = DP)")
    if fsdp.cpu_offload and accelerator in ("cpu", "gloo"):
        reasons.append(f"{field}.cpu_offload needs an accelerator (cuda/xla): on the cpu backend the parameters, "
                       "gradients and optimizer state are in host memory already")
    return reasons


def check_fsdp(fsdp: FsdpConfig, **settings: Any) -> None:
    """Raise one ``ConfigError`` with every reason from :func:`refusals`."""
    reasons = refusals(fsdp, **settings)
    if reasons:
        raise ConfigError("FSDP cannot run with this configuration:\n  - " + "\n  - ".join(reasons))
