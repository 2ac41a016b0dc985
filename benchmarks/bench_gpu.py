"""One-GPU training-step benchmark at the Llama-3.2-1B shape (issue 17): nxd eager / compiled vs
transformers eager / compiled (and torchtitan's Llama 3 when importable), bf16 parameters, fused
AdamW, batch 4 x 2048, one process with the variants' steps alternated so clock and thermal drift
hit all alike. Prints step time, tokens/s, MFU (6 * matmul params + 12 * layers * hidden * seq FLOPs
per token over the GPU's dense bf16 peak) and peak CUDA memory per variant.

    python benchmarks/bench_gpu.py [--steps 20] [--batch 4] [--seq 2048] [--layers 16] [--only nxd-eager,...]

Exits with a message (code 2) on a machine without CUDA. On the device machine, carry the nxd wheels
(and pydantic's) in .whl: it has no network."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

import torch

#: Llama-3.2-1B (vocab trimmed by --vocab to keep the head from dominating small runs if wanted)
SHAPE = dict(hidden_size=2048, intermediate_size=8192, num_attention_heads=32, num_key_value_heads=8,
             num_hidden_layers=16, vocab_size=128256, max_position_embeddings=4096, rope_theta=500000.0,
             rms_norm_eps=1e-5, tie_word_embeddings=True)
PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0}


def flops_per_token(shape: dict, seq: int) -> float:
    from nxd_models_llama.spec import config_from_dict
    from nxd_models_llama.spec import flops_per_token as fpt

    return fpt(config_from_dict(shape), seq_length=seq)


def nxd_model(shape: dict, compiled: bool, fused: tuple[str, ...] = ()) -> torch.nn.Module:
    """``fused``: ops run by Liger-Kernel (nxd_core_parallel.fused_kernels)."""
    import nxd
    from nxd_models_llama.spec import build, config_from_dict

    nxd_config = nxd.neuronx_distributed_config(compile_config=compiled)
    config = config_from_dict({**shape, "dtype": "bfloat16", "fused_kernels": fused})
    return nxd.initialize_parallel_model(nxd_config, build, False, config, nxd_config)


def hf_model(shape: dict, compiled: bool) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    model = LlamaForCausalLM(LlamaConfig(**shape, attn_implementation="sdpa")).to(torch.bfloat16)
    if compiled:
        for layer in model.model.layers:
            layer.compile()
    return model


def torchtitan_model(shape: dict, compiled: bool, recipe: bool = False) -> torch.nn.Module:
    """torchtitan's Llama 3 (``torchtitan==0.2.2``; its model has an untied output head). ``recipe``:
    torchtitan's own one-GPU setup, fp32 parameters under bf16 autocast with each block compiled
    ``fullgraph=True`` (``apply_compile`` / ``maybe_enable_amp``); otherwise bf16 parameters like
    the other variants."""
    from torchtitan.models.llama3 import Transformer, TransformerModelArgs  # type: ignore[import-not-found]

    args = TransformerModelArgs(dim=shape["hidden_size"], n_layers=shape["num_hidden_layers"],
                                n_heads=shape["num_attention_heads"], n_kv_heads=shape["num_key_value_heads"],
                                vocab_size=shape["vocab_size"], rope_theta=shape["rope_theta"],
                                ffn_dim_multiplier=1.5, multiple_of=256, max_seq_len=shape["max_position_embeddings"])
    with torch.device("cuda"), torch.no_grad():
        model = Transformer(args)
        model.init_weights()
    if not recipe:
        model = model.to(torch.bfloat16)
    if compiled:
        for layer_id, block in model.layers.named_children():
            model.layers.register_module(layer_id, torch.compile(block, fullgraph=True))
    return model


def make_step(model: torch.nn.Module, ids: torch.Tensor, kind: str, autocast: bool = False) -> Callable[[], None]:
    model.cuda().train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            if kind == "titan":
                logits = model(ids)
                loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), ids.flatten())
            else:
                loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=SHAPE["num_hidden_layers"])
    parser.add_argument("--vocab", type=int, default=SHAPE["vocab_size"])
    parser.add_argument("--only", default="", help="comma-separated variant names")
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_gpu.py needs a CUDA GPU (torch.cuda.is_available() is False); run it on a GPU machine "
              "(see docs/benchmarks.md)", file=sys.stderr)
        return 2
    import torch.distributed as dist

    if not dist.is_initialized():  # nxd's parallel layers need a (one-rank) process group
        dist.init_process_group("nccl", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
    shape = {**SHAPE, "num_hidden_layers": args.layers, "vocab_size": args.vocab}
    factories = {
        "nxd-eager": lambda: (nxd_model(shape, False), "hf"), "nxd-compiled": lambda: (nxd_model(shape, True), "hf"),
        # compiled blocks + Liger's fused linear cross-entropy (inductor already fuses norm/SwiGLU/RoPE)
        "nxd-compiled-fusedce": lambda: (nxd_model(shape, True, ("cross_entropy",)), "hf"),
        "nxd-fused": lambda: (nxd_model(shape, False, ("rms_norm", "swiglu", "rope", "cross_entropy")), "hf"),
        "hf-eager": lambda: (hf_model(shape, False), "hf"), "hf-compiled": lambda: (hf_model(shape, True), "hf"),
        "torchtitan-eager": lambda: (torchtitan_model(shape, False), "titan"),
        "torchtitan-compiled": lambda: (torchtitan_model(shape, True), "titan"),
        # torchtitan's one-GPU recipe: fp32 params + bf16 autocast, blocks compiled
        "torchtitan-recipe": lambda: (torchtitan_model(shape, True, recipe=True), "titan-amp"),
    }
    wanted = [n for n in factories if not args.only or n in args.only.split(",")]
    ids = torch.randint(0, args.vocab, (args.batch, args.seq), device="cuda")
    name = torch.cuda.get_device_name()
    peak = next((v for k, v in PEAK_TFLOPS.items() if k in name), None)
    fpt = flops_per_token(shape, args.seq)
    tokens = args.batch * args.seq
    print(f"{name}, torch {torch.__version__}, batch {args.batch} x {args.seq}, layers {args.layers}, "
          f"vocab {args.vocab}, {fpt / 1e9:.2f} GFLOP/token")
    # Every variant stays resident (about 14 GiB each at the 1B shape with AdamW states: use --only
    # to fit) and the timed steps go round-robin, so drift hits all alike. A variant's peak memory is
    # its resident bytes (weights, grads, optimizer state after warm-up) plus its largest step transient.
    steps: dict[str, Callable[[], None]] = {}
    resident: dict[str, int] = {}
    for variant in wanted:
        before = torch.cuda.memory_allocated()
        try:
            model, kind = factories[variant]()
        except ImportError as exc:  # a peer that is not installed: say so, run the rest
            print(f"{variant}: skipped ({type(exc).__name__}: {exc})")
            continue
        steps[variant] = make_step(model, ids, kind.removesuffix("-amp"), autocast=kind.endswith("-amp"))
        for _ in range(args.warmup):  # compiles, allocates optimizer state
            steps[variant]()
        torch.cuda.synchronize()
        resident[variant] = torch.cuda.memory_allocated() - before
    results: dict[str, list[float]] = {v: [] for v in steps}
    transient: dict[str, int] = dict.fromkeys(steps, 0)
    for _ in range(args.steps):
        for variant, step in steps.items():
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            t0 = time.perf_counter()
            step()
            torch.cuda.synchronize()
            results[variant].append(time.perf_counter() - t0)
            transient[variant] = max(transient[variant], torch.cuda.max_memory_allocated() - base)
    peaks = {v: (resident[v] + transient[v]) / 2**30 for v in steps}
    print(f"{'variant':22} {'step s':>8} {'spread':>7} {'tokens/s':>10} {'MFU':>7} {'peak GiB':>9}")
    rows = []
    for variant, times in results.items():
        ordered = sorted(times)
        median = ordered[len(ordered) // 2]
        spread = (ordered[-2] - ordered[1]) / median if len(ordered) > 3 else float("nan")  # drop one outlier each side
        mfu = tokens * fpt / median / (peak * 1e12) if peak else float("nan")
        print(f"{variant:22} {median:8.4f} {spread:7.1%} {tokens / median:10.0f} {mfu:7.1%} {peaks[variant]:9.2f}")
        rows.append(dict(variant=variant, step_s=median, spread=spread, tokens_per_s=tokens / median, mfu=mfu,
                         peak_gib=peaks[variant], times=times))
    if args.json:
        import json

        meta = dict(gpu=name, torch=torch.__version__, batch=args.batch, seq=args.seq, layers=args.layers,
                    vocab=args.vocab, gflop_per_token=fpt / 1e9)
        with open(args.json, "w") as fh:
            json.dump(dict(meta=meta, rows=rows), fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
