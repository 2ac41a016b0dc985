"""nxd-moe benchmark: a MoE layer's forward + backward with expert parallelism against the same
experts run densely on every rank.

Two CPU ranks (gloo), 8 experts, top-2, dropless. Both sides hold the same router and experts:
  * ``ep``: nxd-moe's ``MoELayer`` at EP=2 — each rank holds 4 experts, tokens travel by all-to-all,
    only the chosen (token, expert) pairs are computed;
  * ``dense``: every rank holds all 8 experts and runs every token through every expert, masked by
    the top-2 affinities (what a layer without routing kernels or EP does).
Timings are medians over ABAB-alternated repeats; the ratio is dense / ep (> 1: EP is faster).
Usage: python benchmarks/bench_moe.py [--tokens 1024] [--hidden 256] [--intermediate 512] [--repeats 7]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

E, TOP_K = 8, 2


def dense_forward(x: torch.Tensor, router: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    probs = F.softmax(x @ router.T, dim=-1)
    top = probs.topk(TOP_K, dim=-1)
    w = torch.zeros_like(probs).scatter(1, top.indices, top.values / top.values.sum(-1, keepdim=True))
    inter = down.shape[-1]
    gate, up = torch.einsum("th,eih->eti", x, gate_up).split(inter, dim=-1)
    y = torch.einsum("eti,ehi->eth", F.silu(gate) * up, down)
    return torch.einsum("eth,te->th", y, w)


def worker(rank: int, port: int, args: argparse.Namespace, out: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    from nxd_core_parallel import parallel_state
    from nxd_moe import MoEConfig, MoELayer

    parallel_state.initialize_model_parallel(1, expert_model_parallel_size=2)
    torch.manual_seed(0)
    layer = MoELayer(MoEConfig(num_experts=E, top_k=TOP_K, dropless=True), args.hidden, args.intermediate)
    router = layer.router.weight.detach().clone().requires_grad_()
    gate_up = torch.randn(E, 2 * args.intermediate, args.hidden, requires_grad=True)
    down = torch.randn(E, args.hidden, args.intermediate, requires_grad=True)
    x = torch.randn(1, args.tokens, args.hidden)

    def run_ep() -> None:
        out_, _ = layer(x)
        out_.sum().backward()

    def run_dense() -> None:
        dense_forward(x[0], router, gate_up, down).sum().backward()

    times: dict[str, list[float]] = {"ep": [], "dense": []}
    for fn in (run_ep, run_dense):
        fn()  # warm-up
    for _ in range(args.repeats):
        for name, fn in (("ep", run_ep), ("dense", run_dense)):
            dist.barrier()
            start = time.perf_counter()
            fn()
            dist.barrier()
            times[name].append(time.perf_counter() - start)
    if rank == 0:
        out.update({k: statistics.median(v) for k, v in times.items()})
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--intermediate", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    manager = mp.Manager()
    out = manager.dict()
    mp.spawn(worker, args=(port, args, out), nprocs=2)
    ep, dense = out["ep"], out["dense"]
    print(f"MoE layer fwd+bwd, {E} experts top-{TOP_K}, {args.tokens} tokens/rank, hidden {args.hidden}, "
          f"intermediate {args.intermediate}, 2 CPU ranks")
    print(f"  EP=2 all-to-all: {ep * 1e3:.1f} ms   dense all-experts masked: {dense * 1e3:.1f} ms   "
          f"ratio dense/EP = {dense / ep:.2f}x")


if __name__ == "__main__":
    main()
