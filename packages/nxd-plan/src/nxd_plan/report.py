"""The plan as text: one row per distinct kind of rank, the bubble, communication, time, fit."""

from __future__ import annotations

from nxd_plan.planner import GIB, Plan


def rank_ranges(ranks: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2,5"``."""
    out, start, prev = [], None, None
    for r in sorted(ranks):
        if start is None:
            start = prev = r
        elif r == prev + 1:
            prev = r
        else:
            out.append(f"{start}-{prev}" if prev != start else str(start))
            start = prev = r
    if start is not None:
        out.append(f"{start}-{prev}" if prev != start else str(start))
    return ",".join(out)


def _unit(plan: Plan) -> tuple[str, int]:
    return ("GiB", GIB) if plan.max_peak >= GIB else ("MiB", 2**20)


def _num(n: float, scale: int) -> str:
    return f"{n / scale:8.2f}"


def _size(n: float) -> str:
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def binary_size(n: float) -> str:
    """Bytes in GiB from 1 GiB up, else MiB (two decimals)."""
    return f"{n / GIB:.2f} GiB" if n >= GIB else f"{n / 2**20:.2f} MiB"


def summary_line(plan: Plan) -> str:
    lay, dev = plan.layout, plan.device
    fits = plan.over_memory()
    fit = "fits" if not fits else f"{len(fits)} rank(s) over {dev.memory_gib:.0f} GiB"
    if plan.activation_profile is not None and not plan.activation_profile.measured:
        fit += ", activations not measured: a lower bound"
    return (f"{plan.name}: world {lay.world_size} = {lay.describe()}; peak {plan.max_peak / GIB:.2f} GiB/rank on "
            f"{dev.name} ({fit}); step ~{plan.step_time_s:.3g} s, MFU ~{100 * plan.mfu:.0f}%")


def text(plan: Plan) -> str:
    lay, dev = plan.layout, plan.device
    lines = [f"nxd plan: {summary_line(plan)}",
             f"parameters: {plan.parameters_total / 1e9:.3f} B ({plan.parameters_total:,}); micro-batch "
             f"{lay.micro_batch_size} x seq {lay.seq_length}, {lay.num_microbatches} micro-batch(es) per step, "
             f"global batch {lay.global_batch_size}; recompute: {lay.recompute or 'none'}",
             f"device {dev.name}: {dev.memory_gib:.1f} GiB, {dev.peak_tflops:g} TFLOP/s, links "
             f"{dev.intra_node_gbps:g} GB/s in a node / {dev.inter_node_gbps:g} GB/s across nodes",
             "",
             f"{'per rank, ' + _unit(plan)[0]:<28}{'params':>8}{'grads':>8}{'optim':>8}{'activ':>8}{'trans':>8}"
             f"{'peak':>8}  ranks"]
    scale = _unit(plan)[1]
    classes: dict[tuple, list] = {}
    for r in plan.ranks:
        key = (r.coords["pp"], r.coords["ep"], r.param_bytes, r.peak_bytes)
        classes.setdefault(key, []).append(r)
    for (pp, ep, _, _), members in sorted(classes.items()):
        r = members[0]
        layers = sorted({i for idx in r.stages.values() for i in idx})
        where = f"pp {pp}" + (f" ep {ep}" if lay.ep > 1 else "")
        if layers:
            where += f" (layers {layers[0]}-{layers[-1]})"
        numbers = (r.param_bytes, r.grad_bytes, r.optimizer_bytes, r.activation_bytes, r.transient_bytes, r.peak_bytes)
        lines.append(f"{where:<28}{''.join(_num(n, scale) for n in numbers)}  "
                     f"{rank_ranges([m.rank for m in members])}")
    lines.append("")
    if lay.pp > 1:
        lines.append(f"pipeline bubble: {100 * plan.bubble:.1f}% ({lay.schedule}, PP {lay.pp}"
                     f"{f' x {lay.vpp} virtual' if lay.vpp > 1 else ''}, {lay.num_microbatches} micro-batches)")
    comm = ", ".join(f"{dim} {_size(n)}" for dim, n in sorted(plan.comm_bytes.items()) if n) or "none"
    lines.append(f"communication per step (busiest rank sends): {comm}")
    lines.append(f"estimated step time {plan.step_time_s:.3g} s, MFU {100 * plan.mfu:.1f}% "
                 f"({plan.flops_per_step:.3g} model FLOPs per step; compute at the device peak, communication "
                 "not overlapped)")
    over = plan.over_memory()
    if over:
        lines.append(f"memory: {len(over)} of {lay.world_size} ranks exceed {dev.memory_gib:.1f} GiB ({dev.name}): "
                     f"ranks {rank_ranges([r.rank for r in over])} (peak {max(r.peak_bytes for r in over) / GIB:.2f} GiB)")
    transforms = next(iter(plan.shards.values())).transforms if plan.shards else []
    lines.append(f"model transforms applied (nxd.transforms, in order): {', '.join(transforms) or 'none'}")
    for note in plan.notes:
        lines.append(f"note: {note}")
    return "\n".join(lines)
