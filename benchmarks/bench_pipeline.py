"""nxd-pipeline schedules vs torch.distributed.pipelining on the same model, micro-batches, stages.

Runs on 2 gloo ranks (PP=2). For each schedule: median step time of ours and of torch's same
schedule (GPipe, 1F1B, Interleaved1F1B; our zero_bubble against torch's 1F1B and, where it runs,
ScheduleInterleavedZeroBubble with one stage per rank), the ratio ours/torch (goal <= 1.0), and
our measured bubble (1 - compute time / step time, averaged over ranks) against the theory.
Usage: .venv/bin/python benchmarks/bench_pipeline.py [--hidden 256 --layers 8 --microbatches 8]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

from nxd_testing.ranks import run_on_ranks


def _stage_module(full, bounds, stage: int, num_stages: int) -> nn.Module:
    class Stage(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = full.embed if stage == 0 else None
            self.layers = nn.ModuleList(full.layers[i] for i in bounds[stage])
            self.norm = full.norm if stage == num_stages - 1 else None
            self.head = full.head if stage == num_stages - 1 else None

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if self.embed is not None:
                x = self.embed(x)
            for layer in self.layers:
                x = layer(x)
            return self.head(self.norm(x)) if self.head is not None else x

    return Stage()


def _time_abba(step_ours, step_torch, iters: int) -> tuple[list[float], list[float]]:
    """Alternate ours and torch's steps (ABBA: the order flips every pair) so load from other
    processes on a shared machine hits both alike; two warm-up pairs are excluded."""
    import torch.distributed as dist

    times: tuple[list[float], list[float]] = ([], [])
    pair = ((0, step_ours), (1, step_torch))
    for i in range(iters + 2):
        for side, step in pair if i % 2 == 0 else pair[::-1]:
            dist.barrier()
            t0 = time.perf_counter()
            step()
            dist.barrier()
            if i >= 2:
                times[side].append(time.perf_counter() - t0)
    return times


def bench_body(args: dict) -> dict:
    import torch.distributed as dist
    from torch.distributed import pipelining as tp

    from nxd_pipeline import NxDPPModel, plan_stages
    from nxd_pipeline.toy import ToyLM, toy_batch

    torch.set_num_threads(1)
    rank, p = dist.get_rank(), dist.get_world_size()
    m, iters = args["microbatches"], args["iters"]
    batch = toy_batch(args["batch"], args["seq"], vocab_size=args["vocab"])
    out: dict = {}
    torch_classes = {"gpipe": tp.ScheduleGPipe, "1f1b": tp.Schedule1F1B, "interleaved_1f1b": tp.ScheduleInterleaved1F1B,
                     "zero_bubble": tp.Schedule1F1B, "zero_bubble~torchZB": tp.ScheduleInterleavedZeroBubble}
    for name, v in [("gpipe", 1), ("1f1b", 1), ("interleaved_1f1b", 2), ("zero_bubble", 1), ("zero_bubble~torchZB", 1)]:
        ours_name = name.split("~")[0]
        torch.manual_seed(0)
        full = ToyLM(vocab_size=args["vocab"], hidden=args["hidden"], num_layers=args["layers"])
        ours = NxDPPModel(full, p, {"num_microbatches": m, "schedule": ours_name, "virtual_pipeline_size": v})
        trace: list = []

        def ours_step(ours=ours, trace=trace) -> None:
            trace.clear()
            ours.trace = trace
            ours.run_train(**batch)
            ours.zero_grad(set_to_none=True)

        # torch: same weights, same stage split
        torch.manual_seed(0)
        full = ToyLM(vocab_size=args["vocab"], hidden=args["hidden"], num_layers=args["layers"])
        n_stages = p * v
        bounds = plan_stages(full, n_stages)
        stages = [tp.PipelineStage(_stage_module(full, bounds, s, n_stages), s, n_stages, torch.device("cpu"))
                  for s in range(rank, n_stages, p)]

        def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            return F.cross_entropy(logits.flatten(0, 1), target.flatten())

        cls = torch_classes[name]

        def torch_step(sched, stages=stages) -> None:
            kwargs = {}
            args_ = (batch["input_ids"],) if rank == 0 else ()
            if rank == p - 1:
                kwargs = {"target": batch["labels"], "losses": []}
            sched.step(*args_, **kwargs)
            for st in stages:
                st.submod.zero_grad(set_to_none=True)

        error = None
        try:
            sched = cls(stages if (v > 1 or cls is tp.ScheduleInterleavedZeroBubble) else stages[0], n_microbatches=m, loss_fn=loss_fn)
            torch_step(sched)  # torch refuses some combinations only when stepping
        except Exception as exc:  # noqa: BLE001 - report what torch refuses
            error = f"{type(exc).__name__}: {exc}"[:80]
        if error is None:
            t_ours, t_torch = _time_abba(ours_step, lambda sched=sched: torch_step(sched), iters)
            ratios = [a / b for a, b in zip(t_ours, t_torch)]
            out[name] = {"ours": statistics.median(t_ours), "torch": statistics.median(t_torch),
                         "ratio": statistics.median(ratios), "busy": sum(c for _, c in trace), "step_last": t_ours[-1]}
        else:
            t_ours, _ = _time_abba(ours_step, lambda: None, iters)
            out[name] = {"ours": statistics.median(t_ours), "torch": None, "error": error,
                         "busy": sum(c for _, c in trace), "step_last": t_ours[-1]}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--iters", type=int, default=6)
    args = vars(ap.parse_args())
    p, m = 2, args["microbatches"]
    per_rank = run_on_ranks(p, bench_body, args)
    print(f"PP={p} gloo CPU, hidden={args['hidden']} layers={args['layers']} batch={args['batch']}x{args['seq']} "
          f"microbatches={m}, median of {args['iters']} ABBA-alternated steps "
          "(ratio: median of the paired ours/torch step ratios)")
    print(f"{'schedule':<22}{'ours ms':>9}{'torch ms':>10}{'ratio':>7}{'bubble':>8}{'theory':>8}")
    for name in per_rank[0]:
        v = 2 if name == "interleaved_1f1b" else 1
        ours = max(r[name]["ours"] for r in per_rank)
        torch_t = per_rank[0][name]["torch"]
        torch_t = max(r[name]["torch"] for r in per_rank) if torch_t is not None else None
        bubble = statistics.mean(1 - r[name]["busy"] / r[name]["step_last"] for r in per_rank)
        theory = (p - 1) / (m + p - 1) / v
        ratio = f"{statistics.median(r[name]['ratio'] for r in per_rank):7.2f}" if torch_t else "    n/a"
        torch_s = f"{torch_t * 1e3:10.1f}" if torch_t else f"{'-':>10}"
        note = f"  ({per_rank[0][name]['error']})" if per_rank[0][name].get("error") else ""
        print(f"{name:<22}{ours * 1e3:9.1f}{torch_s}{ratio}{bubble:8.3f}{theory:8.3f}{note}")
    print("theory: (p-1)/(m+p-1), divided by the virtual stages for interleaved; ZB-H1 ideal is about a third of 1F1B's")


if __name__ == "__main__":
    main()
