"""Context parallelism: activation memory per rank and step time of a tiny Llama on a long sequence
at CP=1 (one process, SDPA) and CP=2 (two gloo ranks, ring attention), same weights and batch.

Activation memory = bytes of the distinct tensors autograd saves for backward during one forward
(``torch.autograd.graph.saved_tensors_hooks``): what a rank must hold until its backward, the
quantity CP divides. Step time = median forward + backward wall time (each rank one thread).

Run: .venv/bin/python benchmarks/bench_context_parallel.py [--seq 2048] [--steps 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from nxd.transforms import parallelize_model
from nxd_testing import run_on_ranks

CONFIG = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, initializer_range=0.05)


def body(seq: int, steps: int) -> dict[str, float]:
    import torch.distributed as dist

    from nxd_context_parallel import get_batch_on_this_context_parallel_rank
    from nxd_core_parallel import parallel_state
    from nxd_models_llama import LlamaConfig, LlamaForCausalLM

    torch.set_num_threads(1)
    cp = dist.get_world_size()
    parallel_state.initialize_model_parallel(context_parallel_size=cp)
    torch.manual_seed(0)
    model = parallelize_model(LlamaForCausalLM(LlamaConfig.from_dict({**CONFIG, "max_position_embeddings": seq})))
    g = torch.Generator().manual_seed(1)
    full = {"input_ids": torch.randint(0, 512, (1, seq), generator=g), "labels": torch.randint(0, 512, (1, seq), generator=g)}
    batch = get_batch_on_this_context_parallel_rank(full)

    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        saved[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(**batch).loss
    loss.backward()
    times = []
    for _ in range(steps):
        dist.barrier()
        start = time.perf_counter()
        model(**batch).loss.backward()
        times.append(time.perf_counter() - start)
    return {"activation_mib": sum(saved.values()) / 2**20, "step_s": statistics.median(times), "loss": float(loss)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    one = run_on_ranks(1, body, args.seq, args.steps)[0]
    two = run_on_ranks(2, body, args.seq, args.steps)
    act2 = max(r["activation_mib"] for r in two)
    step2 = max(r["step_s"] for r in two)
    print(f"tiny Llama (hidden 64, 2 layers), seq {args.seq}, batch 1, fp32, 1 thread per rank")
    print(f"{'':8}{'activation MiB/rank':>22}{'step s':>10}{'loss':>10}")
    print(f"{'CP=1':8}{one['activation_mib']:>22.1f}{one['step_s']:>10.3f}{one['loss']:>10.5f}")
    print(f"{'CP=2':8}{act2:>22.1f}{step2:>10.3f}{two[0]['loss']:>10.5f}")
    print(f"ratio CP=2 / CP=1: activation memory {act2 / one['activation_mib']:.2f}, step time {step2 / one['step_s']:.2f}")


if __name__ == "__main__":
    main()
