"""``make_run_plan``: the whole plan of a config (every rank's memory, communication, time)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from nxd_plan import memory
from nxd_plan.activations import ActivationProfile, measure_activations, replica_overrides, unmeasured
from nxd_plan.devices import Device, device_for, with_overrides
from nxd_plan.layout import Layout, layout_of
from nxd_plan.shards import Shard, build_shard

GIB = 2**30
#: layers of the replica whose activations are measured (later layers are taken to be alike)
MEASURED_LAYERS = 3


@dataclass
class RankPlan:
    rank: int
    coords: dict[str, int]
    param_bytes: int
    grad_bytes: int
    optimizer_bytes: int
    activation_bytes: int
    transient_bytes: int
    peak_bytes: int
    params: int
    stages: dict[int, list[int]]
    #: data-parallel buffers alive through training (gradient buckets of the overlapped all-reduce)
    buffer_bytes: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "coords": self.coords, "params": self.params, "param_bytes": self.param_bytes,
                "grad_bytes": self.grad_bytes, "optimizer_bytes": self.optimizer_bytes,
                "activation_bytes": self.activation_bytes, "transient_bytes": self.transient_bytes,
                "buffer_bytes": self.buffer_bytes,
                "peak_bytes": self.peak_bytes, "stages": {str(k): v for k, v in self.stages.items()}}


@dataclass
class Plan:
    name: str
    layout: Layout
    device: Device
    parameters_total: int
    num_layers: int
    ranks: list[RankPlan]
    #: bytes each rank sends per step, per dimension (the most loaded rank)
    comm_bytes: dict[str, int]
    bubble: float
    flops_per_step: float
    step_time_s: float
    mfu: float
    tokens_per_step: int
    shards: dict[tuple[int, int], Shard] = field(default_factory=dict)
    activation_profile: ActivationProfile | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def max_peak(self) -> int:
        return max(r.peak_bytes for r in self.ranks)

    def over_memory(self) -> list[RankPlan]:
        limit = self.device.memory_gib * GIB
        return [r for r in self.ranks if r.peak_bytes > limit]

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "world_size": self.layout.world_size, "parameters_total": self.parameters_total,
            "layout": self.layout.as_dict(), "device": self.device.__dict__,
            "ranks": [r.as_dict() for r in self.ranks],
            "max_peak_bytes": self.max_peak, "ranks_over_memory": [r.rank for r in self.over_memory()],
            "comm_bytes_per_step": self.comm_bytes, "pipeline_bubble": self.bubble,
            "flops_per_step": self.flops_per_step, "step_time_s": self.step_time_s, "mfu": self.mfu,
            "tokens_per_step": self.tokens_per_step, "notes": self.notes,
            "model_transforms": next(iter(self.shards.values())).transforms if self.shards else [],
            "activations_measured": self.activation_profile.measured if self.activation_profile else False,
        }


def resolve(source: Any, overrides: Sequence[str] = ()) -> Any:
    """The one resolved :class:`nxd_training.config.TrainingConfig` of ``source`` (a YAML path, ``hub:`` name,
    dict, or an already resolved config, which is used as it is): ``nxd train``'s own resolution
    (``resolve_config``), the data module's files excepted (they need not exist here). Overrides on a
    resolved config re-resolve its sections: a different config (the activation replica, a
    proposed layout)."""
    from nxd_training.config import TrainingConfig, load_config, resolve_config

    if isinstance(source, TrainingConfig) and source.resolved:
        if not overrides:
            return source
        source = source.model_dump(mode="json", by_alias=True)
    return resolve_config(load_config(source, list(overrides), check=False), check_data=False)


def load(source: Any, overrides: Sequence[str] = ()) -> tuple[Any, Any]:
    """The resolved config (:func:`resolve`) and the RunConfig it carries (nothing derived again)."""
    config = resolve(source, overrides)
    return config, config.run


def _model_config(run: Any) -> tuple[Any, Any]:
    """(the model spec, its config object) the RunConfig's resolution recorded."""
    from nxd_training.config.resolved import model_config_of, model_spec_of

    spec = model_spec_of(run)
    return spec, model_config_of(run, spec)


def _num_layers(run: Any) -> int:
    model_config = _model_config(run)[1]
    return int(getattr(model_config, "num_hidden_layers", 0) or getattr(model_config, "num_layers", 0))


def _representatives(layout: Layout) -> dict[tuple[int, int], int]:
    """One rank per (pipeline rank, expert rank): the coordinates that change a rank's shapes
    when TP shards evenly (TP rank 0 stands for its TP group; the dry run checks every rank)."""
    reps: dict[tuple[int, int], int] = {}
    for rank in range(layout.world_size):
        c = layout.coords(rank)
        if c["tp"] == 0:
            reps.setdefault((c["pp"], c["ep"]), rank)
    return reps


def other_roles(layout: Layout, reps: dict[tuple[int, int], int]) -> list[int]:
    """Ranks built besides the representatives so every role is built once: the representatives sit
    at TP, CP and DP coordinate 0; the last rank sits at the last of each (the last vocabulary or
    FSDP shard, the last context chunk)."""
    last = layout.world_size - 1
    return [] if last in reps.values() else [last]


def measure_replica(source: Any, overrides: Sequence[str], layout: Layout, num_layers: int) -> ActivationProfile:
    extra = replica_overrides(layout)
    if num_layers > MEASURED_LAYERS:
        extra.append(f"model.num_layers={MEASURED_LAYERS}")
    config, run = load(source, [*overrides, *extra])
    # FSDP never holds the whole replica's unsharded gradients (one block's at a time: fsdp_unsharded_bytes)
    return measure_activations(config, run, layout, grads_exist=memory.grads_persist(layout) or layout.fsdp)


def _ring(kind: str, n: int, nbytes: float) -> float:
    """Bytes one rank sends in a ring collective over ``n`` ranks of an ``nbytes`` buffer."""
    if n <= 1:
        return 0.0
    if kind == "all_reduce":
        return 2.0 * (n - 1) / n * nbytes
    if kind in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n * nbytes
    return float(nbytes)  # send / recv / broadcast


def bubble_fraction(layout: Layout) -> float:
    """Idle fraction of a pipeline step: ``(PP-1) / (v*M + PP-1)`` (GPipe, 1F1B, interleaved with
    v virtual stages); zero-bubble fills most of it (taken as a third)."""
    if layout.pp == 1:
        return 0.0
    m, pp, v = layout.num_microbatches, layout.pp, layout.vpp
    frac = (pp - 1) / (v * m + pp - 1)
    return frac / 3 if layout.schedule == "zero_bubble" else frac


def make_run_plan(source: Any, overrides: Sequence[str] = (), *, device: str | Device | None = None,
                  memory_gib: float | None = None, peak_tflops: float | None = None,
                  link_gbps: float | None = None) -> Plan:
    config, run = load(source, overrides)
    layout = layout_of(config, run)
    base = device if isinstance(device, Device) else device_for(config, device)
    dev = with_overrides(base, memory_gib, peak_tflops, link_gbps)
    num_layers = _num_layers(run)
    reps = _representatives(layout)
    shards = {key: build_shard(config, run, rank) for key, rank in reps.items()}
    checked = other_roles(layout, reps)
    for rank in checked:  # built (a failure is refused) but not planned: its shapes are its representative's
        build_shard(config, run, rank)
    try:
        profile = measure_replica(config, replica_base_overrides(layout), layout, num_layers)
    except Exception as exc:  # noqa: BLE001 - an estimate the planner cannot make is said, never a crash
        profile = unmeasured(f"its measurement on the meta device failed ({type(exc).__name__}: {exc})")
    total = _parameters_total(shards, layout)
    ranks = []
    for rank in range(layout.world_size):
        c = layout.coords(rank)
        shard = shards[(c["pp"], c["ep"])]
        index = fsdp_index(shard, c)
        trainable = shard.stored_numel(index, trainable=True)
        p = shard.stored_bytes(index)
        g = memory.grad_bytes(layout, trainable)
        o = memory.optimizer_bytes(layout, trainable)
        a = memory.activation_bytes(layout, profile, shard.stages, num_layers)
        t = profile.transient + memory.fsdp_unsharded_bytes(layout, shard)
        b = memory.dp_buffer_bytes(layout, g)
        peak = p + o + b + (g if memory.grads_persist(layout) else 0) + a + t
        ranks.append(RankPlan(rank, c, p, g, o, a, t, peak, shard.stored_numel(index), shard.stages, b))
    comm = _comm(layout, shards, profile, num_layers)
    flops_step, step_time, mfu = _timing(config, run, layout, dev, comm, num_layers)
    plan = Plan(config.name, layout, dev, total, num_layers, ranks, {k: int(v) for k, v in comm.items()},
                bubble_fraction(layout), flops_step, step_time, mfu,
                layout.global_batch_size * layout.seq_length, shards, profile)
    plan.notes.append(f"shapes of one rank per (pipeline, expert) coordinate built on the meta device "
                      f"({len(shards)} builds, {len(checked)} more rank(s) built to check their roles); "
                      f"--dry-run builds all {layout.world_size}")
    if layout.fsdp:
        plan.notes.append("FSDP: each rank's shards are fully_shard's own DTensors (built on the meta parameters "
                          "with a CPU DeviceMesh over the fake group); a rank's rows follow FSDP's Shard(0) "
                          "chunking at its DP coordinate, which --dry-run checks on every rank")
    plan.notes.extend(quantized_notes(shards))
    plan.notes.extend(profile.notes)
    if num_layers > MEASURED_LAYERS and profile.measured:
        plan.notes.append(f"activations measured on a {MEASURED_LAYERS}-layer replica; later layers taken as alike")
    return plan


def quantized_notes(shards: dict) -> list[str]:
    """What the rank's quantised base weights (QLoRA's NF4) take: bytes per parameter, scales included."""
    numel, nbytes = map(sum, zip(*(s.quantized_numel_bytes() for s in shards.values()))) if shards else (0, 0)
    if not numel:
        return []
    return [f"QLoRA: {numel:,} base weight elements stored as NF4 take {nbytes:,} bytes, {nbytes / numel:.4f} bytes "
            "per parameter (0.5 for the 4-bit codes + their double-quantised block scales), counted in the "
            "parameter bytes above (per pipeline/expert coordinate, before FSDP sharding)"]


def replica_base_overrides(layout: Layout) -> list[str]:
    """The activation replica runs without FSDP: its all-gathers would run on the meta device; FSDP's
    unsharded working set is added by rule (:func:`memory.fsdp_unsharded_bytes`)."""
    return ["distributed_strategy.fsdp=false"] if layout.fsdp else []


def fsdp_index(shard: Shard, coords: dict[str, int]) -> int | None:
    """A rank's index on the FSDP mesh's shard dimension: its DP coordinate within its row of
    ``replicate x shard`` DP ranks (nxd_fsdp.mesh lays HSDP out row by row); None without FSDP."""
    return coords["dp"] % shard.fsdp[1] if shard.fsdp else None


def _parameters_total(shards: dict[tuple[int, int], Shard], layout: Layout) -> int:
    """The unsharded model's parameter count, from the shards of one rank per (pp, ep) coordinate
    (each parameter's TP pieces from its sharding attributes; pipeline stages hold disjoint
    layers; tied weights shared by the first and last stage are counted on each)."""
    return sum(shard.unsharded_numel(ep == 0) for (_, ep), shard in shards.items())


def _comm(layout: Layout, shards: dict, profile: ActivationProfile, num_layers: int) -> dict[str, float]:
    """Bytes the busiest rank sends per step in each dimension."""
    m = layout.num_microbatches
    measured_layers = max(1, len(profile.layers))
    most_layers = max((sum(len(v) for v in s.stages.values()) or num_layers) for s in shards.values())
    scale = most_layers / measured_layers if num_layers > measured_layers else 1.0
    comm: dict[str, float] = {}
    for (dim, kind), (_, nbytes, size) in profile.collectives.items():
        if dim in ("tp", "cp", "ep"):
            comm[dim] = comm.get(dim, 0.0) + _ring(kind, size, nbytes) * scale * m
    shard = max(shards.values(), key=lambda s: s.trainable_numel)
    trainable = shard.trainable_numel
    grad_elem = 4 if layout.zero1 and (layout.param_bytes_per_element == 4 or layout.fp32_grad_acc) \
        else layout.param_bytes_per_element
    n = layout.dp * layout.cp  # gradients are averaged over DP x CP
    if layout.fsdp:
        per_mb = 2 * _ring("all_gather", layout.dp, trainable * layout.param_bytes_per_element) + \
            _ring("reduce_scatter", layout.dp, trainable * grad_elem)
        comm["dp"] = per_mb * m
    elif layout.zero1:
        comm["dp"] = _ring("reduce_scatter", n, trainable * grad_elem) + \
            _ring("all_gather", layout.dp, trainable * layout.param_bytes_per_element)
    else:
        comm["dp"] = _ring("all_reduce", n, trainable * grad_elem)
    if layout.pp > 1:
        tokens = layout.micro_batch_size * layout.seq_length // layout.cp
        hidden = _hidden(shards)
        per = tokens * hidden * layout.param_bytes_per_element // (layout.tp if layout.sequence_parallel else 1)
        comm["pp"] = 2.0 * per * m * layout.vpp  # activations forward, their gradients backward
    return comm


def _hidden(shards: dict) -> int:
    for shard in shards.values():
        for name, (shape, _, _) in shard.params.items():
            if name.endswith("norm.weight") and len(shape) == 1:
                return shape[0]
    return 0


def _spans_nodes(layout: Layout, dim: str, per_node: int) -> bool:
    from nxd_plan.layout import _rank_layout

    groups = _rank_layout(layout.world_size, layout.tp, layout.pp, layout.cp, layout.ep)[dim if dim != "dp" else "dp_cp"]
    return any(len({r // per_node for r in g}) > 1 for g in groups)


def _timing(config: Any, run: Any, layout: Layout, dev: Device, comm: dict[str, float],
            num_layers: int) -> tuple[float, float, float]:
    """Model FLOPs per step (the spec's ``flops_per_token``), compute at the device peak (plus
    recomputation), stretched by the bubble, plus communication at link speed (not overlapped:
    an upper bound)."""
    from nxd_training.metrics import flops_per_token

    fpt = flops_per_token(*_model_config(run), layout.seq_length) or 0.0
    tokens = layout.global_batch_size * layout.seq_length
    flops = fpt * tokens
    recompute = 4 / 3 if layout.recompute == "full" else 1.0
    compute = flops * recompute / layout.world_size / (dev.peak_tflops * 1e12)
    per_node = max(1, config.trainer.devices)
    comm_time = 0.0
    for dim, nbytes in comm.items():
        bw = dev.inter_node_gbps if _spans_nodes(layout, dim, per_node) else dev.intra_node_gbps
        comm_time += nbytes / (bw * 1e9)
    step = compute / (1 - bubble_fraction(layout)) + comm_time
    mfu = flops / (step * dev.peak_tflops * 1e12 * layout.world_size) if step > 0 else 0.0
    return flops, step, mfu
