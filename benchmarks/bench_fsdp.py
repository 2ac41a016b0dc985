"""nxd-fsdp against a bare ``fully_shard`` model on gloo ranks (CPU), fp32 AdamW, and memory per rank
against ZeRO-1 and plain data parallelism on the same model.

Time: one process pair holds both models (same weights, same blocks as FSDP units, same mesh
ranks) and alternates their steps, so machine load hits both alike:
  * bare: ``fully_shard`` of each block and the root, ``loss.backward()``,
    ``torch.nn.utils.clip_grad_norm_`` (on the DTensors), ``AdamW.step()``;
  * nxd: ``neuronx_distributed_config(fsdp_config=True)``, ``initialize_parallel_model`` /
    ``initialize_parallel_optimizer``, ``model.run_train(x)`` and ``opt.step()`` (clipping included).
Prints median ms per step and nxd / bare (goal <= 1.02).

Memory: a fresh set of ranks per strategy (ddp, zero1, fsdp) and DP size; per rank the bytes of
parameters + gradients + optimizer state this rank holds after a step (DTensors: their local
shards), against the unsharded total; and the peak resident memory the run added
(``ru_maxrss`` after the steps minus before the model was built; glibc keeps freed pages, so this
is the high-water mark of the process, noisy at small sizes).
Build memory: per rank, the CPU allocator's high-water mark (torch.profiler ``profile_memory``: the
running sum of tensor allocations and frees, not the process's resident size) while
``initialize_parallel_model`` builds the FSDP model, without and with ``meta_device_init`` (built on
the meta device, sharded, then only this rank's shards materialised), and the parameter bytes the
rank holds afterwards.
Run: python benchmarks/bench_fsdp.py [--width 1024] [--layers 4] [--dp 2 4] [--skip-time] [--skip-memory]
[--skip-build]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time

import torch
import torch.distributed as dist
from torch import nn

from nxd_testing.ranks import RankPool

WARMUP, ITERS, BATCH = 4, 24, 16
TIMEOUT = 3600.0  # seconds a body may take (a busy 2-core host is slow)


def run_on_ranks(world: int, fn, *args):
    with RankPool(world, timeout=TIMEOUT) as pool:
        return pool.run(fn, *args)


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(width, 2 * width), nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(x)))


class Net(nn.Module):
    nxd_transformer_layer_classes = (Block,)

    def __init__(self, width: int, layers: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.ModuleList(Block(width) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x.pow(2).mean()


def _local(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def held_bytes(model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, int]:
    """Parameters, gradients and optimizer state (step counters left out) this rank holds."""
    params = list(model.parameters())
    inner = getattr(opt, "optim", None) or getattr(opt, "optimizer", opt)  # ZeRO-1's sharded torch optimizer: .optim
    state = [v for s in inner.state.values() for k, v in s.items() if torch.is_tensor(v) and k != "step"]
    size = lambda ts: sum(_local(t).numel() * _local(t).element_size() for t in ts)  # noqa: E731
    return {"params": size(params), "grads": size([p.grad for p in params if p.grad is not None]), "state": size(state)}


def time_body(width: int, layers: int) -> tuple[float, float]:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    import nxd

    torch.set_num_threads(1)
    cfg = nxd.neuronx_distributed_config(fsdp_config=True, optimizer_config={"grad_clipping": True, "max_grad_norm": 1.0})
    nxd_model = nxd.initialize_parallel_model(cfg, Net, False, width, layers)
    nxd_opt = nxd.initialize_parallel_optimizer(cfg, torch.optim.AdamW, nxd_model.parameters(), lr=1e-4)
    bare = Net(width, layers)
    mesh = DeviceMesh.from_group(nxd.get_parallel_context().dp.group, "cpu")
    for block in bare.layers:
        fully_shard(block, mesh=mesh)
    fully_shard(bare, mesh=mesh)
    bare_opt = torch.optim.AdamW(bare.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(dist.get_rank())

    def bare_step(x: torch.Tensor) -> None:
        bare(x).backward()
        torch.nn.utils.clip_grad_norm_(bare.parameters(), 1.0)
        bare_opt.step()
        bare_opt.zero_grad()

    def nxd_step(x: torch.Tensor) -> None:
        nxd_model.run_train(x)
        nxd_opt.step()
        nxd_opt.zero_grad()

    # each variant runs first in half of the iterations and second in the other (the step right after
    # the barrier measured slower here, whichever it was); the ratio is the median of each iteration's
    # nxd / bare, the two steps taken back to back, so slow drifts of a shared host cancel out
    times: dict[str, list[float]] = {"bare": [], "nxd": []}
    for i in range(WARMUP + ITERS):
        x = torch.randn(BATCH, width, generator=g)
        order = (("bare", bare_step), ("nxd", nxd_step)) if i % 2 else (("nxd", nxd_step), ("bare", bare_step))
        for name, step in order:
            dist.barrier()
            start = time.perf_counter()
            step(x)
            if i >= WARMUP:
                times[name].append(time.perf_counter() - start)
    ratios = [a / b for a, b in zip(times["nxd"], times["bare"])]
    return statistics.median(times["bare"]), statistics.median(times["nxd"]), statistics.median(ratios)


def memory_body(strategy: str, width: int, layers: int) -> dict[str, int]:
    import nxd

    torch.set_num_threads(1)
    kwargs = {"fsdp_config": True} if strategy == "fsdp" else {}
    cfg = nxd.neuronx_distributed_config(optimizer_config={"zero_one_enabled": strategy == "zero1"}, **kwargs)
    g = torch.Generator().manual_seed(dist.get_rank())

    def run(w: int) -> dict[str, int]:
        model = nxd.initialize_parallel_model(cfg, Net, False, w, layers)
        opt = nxd.initialize_parallel_optimizer(cfg, torch.optim.AdamW, model.parameters(), lr=1e-4)
        for _ in range(3):
            model.run_train(torch.randn(BATCH, w, generator=g))
            opt.step()
        return held_bytes(model, opt)

    run(64)  # the same code path on a tiny model first: imports, lazy inits and allocator arenas
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    held = run(width)
    held["peak_rss_added"] = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024
    return held


def build_memory_body(meta: bool, width: int, layers: int) -> dict[str, int]:
    import nxd
    from nxd_core_parallel.model_init import reset_parameters
    from nxd_training.profiling import allocator_high_water

    torch.set_num_threads(1)
    init = {"meta_device_init": True, "param_init_fn": reset_parameters} if meta else None
    cfg = nxd.neuronx_distributed_config(fsdp_config=True, model_init_config=init)
    nxd.initialize_parallel_model(cfg, Net, False, 64, layers)  # the same code path first: imports, lazy inits
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        model = nxd.initialize_parallel_model(cfg, Net, False, width, layers)
    return {"peak": allocator_high_water(prof), "held": sum(_local(p).numel() * 4 for p in model.parameters()),
            "rss_added": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--dp", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--skip-time", action="store_true")
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--skip-build", action="store_true")
    args = parser.parse_args()
    n_params = sum(p.numel() for p in Net(args.width, args.layers).parameters())
    print(f"model: {args.layers} blocks of width {args.width}: {n_params / 1e6:.2f}M fp32 params; torch {torch.__version__}")
    if not args.skip_time:
        bare, ours, ratio = run_on_ranks(2, time_body, args.width, args.layers)[0]
        print(f"step DP=2: median bare fully_shard {bare * 1e3:.1f} ms, nxd FSDP {ours * 1e3:.1f} ms; "
              f"median of per-iteration nxd / bare = {ratio:.3f} (goal <= 1.02)")
    total = n_params * 4
    if not args.skip_build:
        print(f"FSDP build (initialize_parallel_model), per rank; the whole model's parameters: {total} B")
        print("| DP | meta_device_init | allocator peak B/rank | params held B/rank | peak / whole model | peak RSS added MB |")
        print("|---|---|---|---|---|---|")
        for dp in args.dp:
            for meta in (False, True):
                got = run_on_ranks(dp, build_memory_body, meta, args.width, args.layers)
                peak, held = max(r["peak"] for r in got), got[0]["held"]
                print(f"| {dp} | {meta} | {peak} | {held} | {peak / total:.3f} | "
                      f"{max(r['rss_added'] for r in got) / 2**20:.0f} |")
    if args.skip_memory:
        return
    print(f"unsharded: params {total} B, grads {total} B, AdamW state {2 * total} B")
    print("| strategy | DP | params B/rank | grads B/rank | state B/rank | sum / unsharded sum | peak RSS added MB |")
    print("|---|---|---|---|---|---|---|")
    for dp in args.dp:
        for strategy in ("ddp", "zero1", "fsdp"):
            held = run_on_ranks(dp, memory_body, strategy, args.width, args.layers)[0]
            frac = (held["params"] + held["grads"] + held["state"]) / (4 * total)
            print(f"| {strategy} | {dp} | {held['params']} | {held['grads']} | {held['state']} | {frac:.3f} | "
                  f"{held['peak_rss_added'] / 2**20:.0f} |")


if __name__ == "__main__":
    main()
