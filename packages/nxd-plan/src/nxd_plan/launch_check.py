"""The plan ``nxd train`` runs before launch (the ``nxd_plan_run`` hook): one summary line, and a
refusal when the plan proves a rank cannot fit a device memory that is known. Known means given
(``nxd train --device-memory``) or read from where the ranks will run: a visible CUDA device's
memory, or Trainium's per-device memory when the config runs on XLA. Anything else (CPU) is
unknown and never refused."""

from __future__ import annotations

from typing import Any

import torch

from nxd import ConfigError
from nxd_plan.devices import DEVICES, Device, device_for
from nxd_plan.memory import grads_persist
from nxd_plan.planner import GIB, Plan, make_run_plan
from nxd_plan.rank_check import RankBuildError
from nxd_plan.report import binary_size, rank_ranges


def known_device(config: Any, memory_gib: float | None) -> tuple[Device, bool, str]:
    """The device the ranks will run on, whether its memory is known, and where that came from."""
    from nxd_training.runtime import select_backend

    backend = select_backend(config.trainer)
    if backend == "cuda":
        props = torch.cuda.get_device_properties(0)
        name = "h200" if props.total_memory > 100e9 else "h100"
        device = Device(props.name, props.total_memory / GIB, *_rest(DEVICES[name]))
        known, source = True, f"{props.name}'s memory"
    elif backend == "xla":
        device = device_for(config)
        known, source = True, f"{device.name}'s memory (trainer.accelerator=xla, {config.trainer.devices} devices per node)"
    else:
        device = DEVICES["cpu"] if backend == "cpu" else device_for(config)
        known, source = False, "unknown"
    if memory_gib is not None:
        device = Device(device.name, float(memory_gib), *_rest(device))
        known, source = True, "--device-memory"
    return device, known, source


def _rest(device: Device) -> tuple[float, float, float, int]:
    return device.peak_tflops, device.intra_node_gbps, device.inter_node_gbps, device.devices_per_node


def summary(plan: Plan, known: bool) -> str:
    """``nxd train``'s line: the highest per-rank peak and its rank, the device memory when known,
    the step-time estimate."""
    worst = max(plan.ranks, key=lambda r: r.peak_bytes)
    bound = "" if plan.activation_profile is None or plan.activation_profile.measured else " (activations unmeasured: a lower bound)"
    memory = f"device memory {binary_size(plan.device.memory_gib * GIB)}" if known else "device memory unknown (not checked)"
    return (f"plan: {plan.layout.describe()}; peak {binary_size(worst.peak_bytes)}/rank (rank {worst.rank}){bound}; "
            f"{memory}; step ~{plan.step_time_s:.3g} s ({plan.device.name} estimate)")


def refusal(plan: Plan, proposals: list[tuple[dict[str, Any], Plan]], source: str) -> str:
    over = plan.over_memory()
    worst = max(over, key=lambda r: r.peak_bytes)
    layers = sorted({i for idx in worst.stages.values() for i in idx})
    where = f"pipeline stage {worst.coords['pp']}" + (f", layers {layers[0]}-{layers[-1]}" if layers else "")
    grads = worst.grad_bytes if grads_persist(plan.layout) else 0  # else inside the transient
    parts = ", ".join(f"{name} {binary_size(n)}" for name, n in (
        ("params", worst.param_bytes), ("grads", grads), ("optimizer", worst.optimizer_bytes),
        ("DP buffers", worst.buffer_bytes), ("activations", worst.activation_bytes),
        ("transient", worst.transient_bytes)) if n)
    text = (f"the plan proves this layout cannot fit: rank {worst.rank} ({where}) needs "
            f"{binary_size(worst.peak_bytes)} ({parts}) > {binary_size(plan.device.memory_gib * GIB)} ({source}); "
            f"{len(over)} of {plan.layout.world_size} ranks are over (ranks {rank_ranges([r.rank for r in over])}). ")
    if proposals:
        text += "Nearest layouts that fit: " + "; ".join(
            " ".join(f"{k}={v}" for k, v in change.items()) + f" (peak {binary_size(p.max_peak)})"
            for change, p in proposals)
    else:
        text += "No nearby layout fits (TP or PP doubled/halved, ZeRO-1, full recompute were planned)"
    return text + "; `nxd plan CONFIG --device-memory GiB` shows every rank"


def plan_before_launch(config: Any, memory_gib: float | None) -> str | None:
    """See the module doc. Planning builds one rank of every role through the ranks' own build path
    (:mod:`nxd_plan.rank_check`): a rank that cannot be built is refused here, naming the rank and
    the key, never found at launch. What the planner cannot estimate is said in the line."""
    from nxd_plan.proposals import propose

    device, known, source = known_device(config, memory_gib)
    try:
        plan = make_run_plan(config, device=device)
    except RankBuildError as exc:
        raise ConfigError(f"the ranks' own build refuses this config before launch: {exc}") from None
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - unchecked is not valid: refused, with the way around it
        raise ConfigError(f"the pre-launch plan (nxd-plan) failed, so this config's rank builds are unchecked: "
                          f"{type(exc).__name__}: {exc}; NXD_DISABLE_PLUGINS=plan launches without the plan") from None
    if known and plan.over_memory():
        found = propose(plan, config, (), device.memory_gib, device=device)
        raise ConfigError(refusal(plan, found, source))
    return summary(plan, known)
