"""The run's layout as the plan needs it, read from the one resolved config ``nxd train`` uses
(``nxd_training.config.TrainingConfig`` resolved: its sections and its RunConfig)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch

from nxd.parallel import rank_layout
from nxd.resolved import pipeline_schedule
from nxd_training.config.nxdt.precision import BF16_PARAM_TYPES, uses_master_weights

#: optimizer name -> fp32-or-param-dtype state tensors per parameter element (torch's optimizers)
OPTIMIZER_STATES = {"adamw": 2, "adam": 2, "adamw_fp32optstate": 2, "adamax": 2, "adadelta": 2, "rmsprop": 1,
                    "adagrad": 1, "sgd": 0}


@dataclass(frozen=True)
class Layout:
    world_size: int
    tp: int
    pp: int
    vpp: int
    cp: int
    ep: int
    dp: int
    sequence_parallel: bool
    zero1: bool
    fsdp: bool
    precision: str
    param_bytes_per_element: int
    master_weights: bool
    fp32_grad_acc: bool
    optimizer: str
    momentum: float
    recompute: str | None
    micro_batch_size: int
    global_batch_size: int
    num_microbatches: int
    seq_length: int
    schedule: str

    def coords(self, rank: int) -> dict[str, int]:
        """NxD's coordinates of ``rank`` (``nxd.parallel.rank_layout``: the layout the groups use)."""
        layout = _rank_layout(self.world_size, self.tp, self.pp, self.cp, self.ep)
        return {dim: _index_of(layout[dim], rank) for dim in ("tp", "cp", "dp", "pp", "ep", "edp")}

    def describe(self) -> str:
        parts = [f"TP {self.tp}", f"PP {self.pp}" + (f" (x{self.vpp} virtual)" if self.vpp > 1 else ""),
                 f"CP {self.cp}", f"DP {self.dp}"]
        if self.ep > 1:
            parts.append(f"EP {self.ep}")
        dp_kind = "FSDP" if self.fsdp else "ZeRO-1" if self.zero1 else "replicated"
        return " x ".join(parts) + f" ({dp_kind}, {self.precision}, SP {'on' if self.sequence_parallel else 'off'})"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


_LAYOUTS: dict[tuple[int, ...], dict[str, list[list[int]]]] = {}


def _rank_layout(world: int, tp: int, pp: int, cp: int, ep: int) -> dict[str, list[list[int]]]:
    key = (world, tp, pp, cp, ep)
    if key not in _LAYOUTS:
        _LAYOUTS[key] = rank_layout(world, tp=tp, pp=pp, cp=cp, ep=ep)
    return _LAYOUTS[key]


def _index_of(groups: list[list[int]], rank: int) -> int:
    for group in groups:
        if rank in group:
            return group.index(rank)
    raise ValueError(f"rank {rank} is in no group of {groups}")


def fsdp_enabled(config: Any) -> bool:
    """``distributed_strategy.fsdp`` (nxd-fsdp's data-parallel strategy): true, or a section."""
    ds = config.distributed_strategy
    value = getattr(ds, "fsdp", None)
    if value is None:
        value = (getattr(ds, "model_extra", None) or {}).get("fsdp")
    if isinstance(value, dict):
        return bool(value.get("enabled", True))
    return bool(value) if value is not None else False


def layout_of(config: Any, run: Any) -> Layout:
    """The :class:`Layout` of a resolved config (``config``) and the RunConfig it carries (``run``)."""
    ds, p = config.distributed_strategy, config.precision
    recompute, d = run.activation_checkpoint_config, run.derived
    if recompute is not None and not isinstance(recompute, str):
        recompute = ",".join(sorted(c.__name__ for c in recompute))
    bf16 = p.type in BF16_PARAM_TYPES
    master = uses_master_weights(p) and ds.zero1
    grad_acc = p.fp32_grad_acc if p.fp32_grad_acc is not None else master
    return Layout(
        world_size=d.world_size, tp=run.parallel.tp, pp=run.parallel.pp, vpp=ds.virtual_pipeline_model_parallel_size or 1,
        cp=run.parallel.cp, ep=run.parallel.ep, dp=d.dp,
        sequence_parallel=bool(ds.sequence_parallel), zero1=bool(ds.zero1), fsdp=fsdp_enabled(config),
        precision=p.type, param_bytes_per_element=2 if bf16 else 4, master_weights=bool(master),
        fp32_grad_acc=bool(grad_acc and bf16), optimizer=config.model.optim.name.lower(),
        momentum=float(config.model.optim.momentum or 0.0), recompute=recompute,
        micro_batch_size=config.data.micro_batch_size, global_batch_size=config.data.global_batch_size,
        num_microbatches=d.num_microbatches, seq_length=d.seq_length,
        schedule=pipeline_schedule(ds.pipeline_schedule, ds.virtual_pipeline_model_parallel_size or 1) if run.parallel.pp > 1
        else "none",
    )


def param_dtype(layout: Layout) -> torch.dtype:
    return torch.bfloat16 if layout.param_bytes_per_element == 2 else torch.float32
