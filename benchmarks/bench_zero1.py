"""nxd-zero1 vs torch-native peers, side by side on 2 gloo ranks (CPU), fp32 AdamW.

Each rank holds the same MLP and the same backward-produced gradients; timed is the optimizer
side of a training step, i.e. everything after ``backward()``:
  * nxd ZeRO-1: ``NeuronZero1Optimizer.step()`` (grad reduce-scatter [all-reduce + slice on gloo],
    sharded AdamW, all-gather of params), with the gloo-default ``all_reduce`` and with
    ``reduce_scatter``;
  * torch ZeRO: one flat all-reduce of the grads (what DDP would do) + ``ZeroRedundancyOptimizer.step()``
    (sharded AdamW, params broadcast from their owner);
  * plain DP: the same flat all-reduce + torch AdamW on every rank.
Memory per rank is the optimizer state (AdamW exp_avg + exp_avg_sq) plus any fp32 master copy.
Prints median ms per step and ratios nxd / torch ZeRO (goal <= 1.0).
Run: python benchmarks/bench_zero1.py [--width 1024] [--layers 4]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch.distributed.optim import ZeroRedundancyOptimizer

from nxd_testing.ranks import run_on_ranks
from nxd_zero1 import NeuronZero1Optimizer

WARMUP, ITERS, BATCH = 3, 12, 16


def make_model(width: int, layers: int) -> torch.nn.Module:
    torch.manual_seed(0)
    mods: list[torch.nn.Module] = []
    for _ in range(layers):
        mods += [torch.nn.Linear(width, width), torch.nn.GELU()]
    return torch.nn.Sequential(*mods)


def flat_allreduce(params: list[torch.Tensor]) -> None:
    grads = [p.grad for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads]).div_(dist.get_world_size())
    dist.all_reduce(flat)
    off = 0
    for g in grads:
        g.copy_(flat[off:off + g.numel()].view_as(g))
        off += g.numel()


def state_bytes(state: dict) -> int:
    return sum(t.numel() * t.element_size() for s in state.values() for k, t in s.items()
               if torch.is_tensor(t) and k != "step")


def build(kind: str, width: int, layers: int) -> tuple[torch.nn.Module, Callable[[], None], Callable[[], int]]:
    """The model, its optimizer-side step, and its optimizer memory in bytes for one variant."""
    model = make_model(width, layers)
    params = list(model.parameters())
    hp = {"lr": 1e-4, "weight_decay": 0.01}
    if kind.startswith("nxd"):
        impl = "reduce_scatter" if kind.endswith("rs") else "auto"
        opt = NeuronZero1Optimizer(params, torch.optim.AdamW, grad_clipping=False, reduce_impl=impl, **hp)
        # fp32 master shards that are views of the params' own storage cost nothing extra
        extra = [s for s, buf in zip(opt._shards, opt._flat_bufs) if buf is None]
        return model, opt.step, lambda: state_bytes(opt.optim.state) + sum(s.numel() * s.element_size() for s in extra)
    if kind == "torch_zero":
        zero = ZeroRedundancyOptimizer(params, torch.optim.AdamW, **hp)

        def zero_step() -> None:
            flat_allreduce(params)
            zero.step()
        return model, zero_step, lambda: state_bytes(zero.optim.state)
    adamw = torch.optim.AdamW(params, **hp)

    def dp_step() -> None:
        flat_allreduce(params)
        adamw.step()
    return model, dp_step, lambda: state_bytes(adamw.state)


def body(kinds: list[str], width: int, layers: int) -> dict:
    # All variants live in one process group and take turns every iteration, so load from other
    # processes on the machine hits them alike.
    variants = {k: build(k, width, layers) for k in kinds}
    g = torch.Generator().manual_seed(dist.get_rank())
    x = torch.randn(BATCH, width, generator=g)
    times: dict[str, list[float]] = {k: [] for k in kinds}
    for i in range(WARMUP + ITERS):
        for k, (model, step, _) in variants.items():
            model.zero_grad()
            model(x).pow(2).mean().backward()
            dist.barrier()
            t0 = time.perf_counter()
            step()
            dist.barrier()
            if i >= WARMUP:
                times[k].append(time.perf_counter() - t0)
    return {k: {"ms": statistics.median(times[k]) * 1e3, "mem": mem(),
                "checksum": float(sum(p.detach().double().sum() for p in model.parameters()))}
            for k, (model, _, mem) in variants.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=4)
    args = ap.parse_args()
    n = sum(p.numel() for p in make_model(args.width, args.layers).parameters())
    kinds = ["torch_zero", "nxd_zero1", "nxd_zero1_rs", "plain_dp"]
    per_rank = run_on_ranks(2, body, kinds, args.width, args.layers)
    rows = {k: [r[k] for r in per_rank] for k in kinds}
    print(f"\nDP=2 gloo, MLP {args.layers}x{args.width} ({n / 1e6:.2f}M params, fp32 AdamW), "
          f"median of {ITERS} interleaved steps, optimizer side of the step\n")
    print(f"{'variant':<26}{'ms/step':>10}{'vs torch ZeRO':>15}{'opt MB/rank':>13}{'vs plain DP':>13}")
    dp_mem = rows["plain_dp"][0]["mem"]
    for k, label in [("nxd_zero1", "nxd ZeRO-1 (auto=allreduce)"), ("nxd_zero1_rs", "nxd ZeRO-1 reduce_scatter"),
                     ("torch_zero", "torch ZeroRedundancyOpt"), ("plain_dp", "plain DP (AdamW)")]:
        r = max(rows[k], key=lambda v: v["ms"])  # the slower rank sets the pace
        print(f"{label:<26}{r['ms']:>10.2f}{r['ms'] / max(x['ms'] for x in rows['torch_zero']):>15.2f}"
              f"{r['mem'] / 2**20:>13.2f}{r['mem'] / dp_mem:>13.2f}")
    sums = {k: rows[k][0]["checksum"] for k in kinds}
    print(f"\nparam checksums after {WARMUP + ITERS} steps (should agree to fp32 noise): "
          + ", ".join(f"{k}={v:.6f}" for k, v in sums.items()))
    print("Memory: AdamW exp_avg + exp_avg_sq (+ a separate fp32 master copy, none here: fp32 params are the master).")


if __name__ == "__main__":
    main()
