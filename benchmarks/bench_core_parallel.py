"""nxd-core-parallel vs torch-native peers, side by side on 2 gloo ranks (CPU).

* TP=2: a transformer block (attention + MLP) from nxd's Column/RowParallelLinear vs the same
  block of nn.Linear parallelised with DTensor ``parallelize_module`` (Colwise/Rowwise).
* DP=2: an MLP trained with NxDOptimizer (gradient all-reduce overlapped with backward, bucketed
  like DDP) vs DistributedDataParallel; also NxDOptimizer with the after-backward all-reduce.

Prints median ms per training step (forward + backward [+ sync/step]) and the ratio nxd / torch
(goal <= 1.0). Run: python benchmarks/bench_core_parallel.py
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from torch import nn

HID, HEADS, FFN, BATCH, SEQ = 256, 8, 1024, 4, 128
WARMUP, ITERS = 3, 40


class Block(nn.Module):
    """Attention + MLP; ``parallel`` picks nxd's TP layers or plain nn.Linear (for DTensor)."""

    def __init__(self, parallel: bool) -> None:
        super().__init__()
        if parallel:
            from nxd_tensor_parallel.parallel_layers import ColumnParallelLinear, RowParallelLinear

            def col(i, o):
                return ColumnParallelLinear(i, o, bias=False, gather_output=False)

            def row(i, o):
                return RowParallelLinear(i, o, bias=False, input_is_parallel=True)
        else:
            def col(i, o):
                return nn.Linear(i, o, bias=False)
            row = col
        self.q, self.k, self.v, self.o = col(HID, HID), col(HID, HID), col(HID, HID), row(HID, HID)
        self.up, self.down = col(HID, FFN), row(FFN, HID)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = (t(x).view(b, s, -1, HID // HEADS).transpose(1, 2) for t in (self.q, self.k, self.v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, -1)
        x = x + self.o(a)
        return x + self.down(F.gelu(self.up(x)))


def _compare(step_ours, step_theirs) -> dict[str, float]:
    """Median ms per step of each, measured alternately step by step (a barrier before each timed
    step, the order flipped every pair), so load from other processes on a shared machine hits
    both alike."""
    import statistics

    import torch.distributed as dist

    for _ in range(WARMUP):
        step_ours()
        step_theirs()
    times: dict[str, list[float]] = {"nxd": [], "torch": []}
    pair = (("nxd", step_ours), ("torch", step_theirs))
    for i in range(ITERS):
        for name, step in pair if i % 2 == 0 else pair[::-1]:  # ABBA: no order bias
            dist.barrier()
            start = time.perf_counter()
            step()
            times[name].append((time.perf_counter() - start) * 1e3)
    return {k: statistics.median(v) for k, v in times.items()}


def tp_body() -> dict[str, float]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from nxd_core_parallel import parallel_state

    parallel_state.initialize_model_parallel(2)
    x = torch.randn(BATCH, SEQ, HID, generator=torch.Generator().manual_seed(0))
    ours = Block(parallel=True)

    def step_ours() -> None:
        ours(x).sum().backward()

    mesh = init_device_mesh("cpu", (2,))
    torch.manual_seed(0)
    theirs = parallelize_module(Block(parallel=False), mesh, {
        "q": ColwiseParallel(), "k": ColwiseParallel(), "v": ColwiseParallel(), "o": RowwiseParallel(),
        "up": ColwiseParallel(), "down": RowwiseParallel(),
    })

    def step_theirs() -> None:
        theirs(x).sum().backward()

    return _compare(step_ours, step_theirs)


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(HID, FFN), nn.GELU(), nn.Linear(FFN, FFN), nn.GELU(), nn.Linear(FFN, HID))


def dp_body(overlap: bool) -> dict[str, float]:
    from torch.nn.parallel import DistributedDataParallel

    from nxd_core_parallel import parallel_state
    from nxd_core_parallel.trainer import NxDOptimizer

    parallel_state.initialize_model_parallel(1)
    x = torch.randn(BATCH * SEQ, HID, generator=torch.Generator().manual_seed(0))
    cfg = {"optimizer_config": {"grad_clipping": False}, "sequence_parallel": False}
    ours = _mlp()
    opt_ours = NxDOptimizer(torch.optim.SGD(ours.parameters(), lr=1e-3), cfg, overlap_grad_sync=overlap)

    def step_ours() -> None:
        ours(x).square().mean().backward()
        opt_ours.step()
        opt_ours.zero_grad()

    theirs = DistributedDataParallel(_mlp())
    opt_theirs = torch.optim.SGD(theirs.parameters(), lr=1e-3)

    def step_theirs() -> None:
        theirs(x).square().mean().backward()
        opt_theirs.step()
        opt_theirs.zero_grad()

    return _compare(step_ours, step_theirs)


def main() -> None:
    from nxd_testing import RankPool

    rows = []
    with RankPool(2) as pool:
        tp = pool.run(tp_body)[0]
        rows.append(("TP=2 block fwd+bwd", "DTensor parallelize_module", tp))
        rows.append(("DP=2 MLP train step", "DistributedDataParallel", pool.run(dp_body, True)[0]))
        rows.append(("  same, after-backward", "DistributedDataParallel", pool.run(dp_body, False)[0]))
    print(f"\nnxd-core-parallel benchmark (2 gloo ranks, CPU; hidden={HID}, ffn={FFN}, batch={BATCH}x{SEQ}; "
          f"median of {ITERS} alternating steps)")
    print(f"{'case':<22} {'peer':<28} {'nxd ms':>8} {'peer ms':>8} {'ratio':>6}")
    for case, peer, r in rows:
        print(f"{case:<22} {peer:<28} {r['nxd']:>8.2f} {r['torch']:>8.2f} {r['nxd'] / r['torch']:>6.2f}")


if __name__ == "__main__":
    main()
