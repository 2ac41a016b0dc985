"""One-GPU training-step benchmark at the Llama-3.2-1B shape (issue 17) or Llama-3-8B layers
(`--shape 8b-layer`, issue 35): nxd eager / compiled vs transformers eager / compiled (and
torchtitan's Llama 3 when importable), bf16 parameters, fused AdamW, batch 4 x 2048, one process with
the variants' steps alternated so clock and thermal drift hit all alike. Prints step time, tokens/s,
MFU (6 * matmul params + 12 * layers * hidden * seq FLOPs per token over the GPU's dense bf16 peak)
and peak CUDA memory per variant. FP8 (issue 35): `nxd-compiled-amp` (fp32 params, bf16 autocast)
is the baseline of `nxd-compiled-fp8` / `-fp8-rowwise` (the same plus nxd-fp8's FP8 linear layers).

    python benchmarks/bench_gpu.py [--steps 20] [--batch 4] [--seq 2048] [--layers 16] [--only nxd-eager,...]
    python benchmarks/bench_gpu.py --loss-steps 200 --only nxd-compiled-amp,nxd-compiled-fp8   # loss curves
    python benchmarks/bench_gpu.py --moe       # MoE experts: torch._grouped_mm vs a loop of matmuls
    python benchmarks/bench_gpu.py --cpu-smoke # tiny shapes on the CPU (FP8 emulated): the script runs

Exits with a message (code 2) on a machine without CUDA (unless --cpu-smoke). On the device machine,
carry the nxd wheels (and pydantic's, torchao's) in .whl: it has no network."""

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
#: Llama-3-8B's layer shape (run a few layers: --layers; default 4): FP8's gain grows with the GEMMs
SHAPE_8B_LAYER = {**SHAPE, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 4,
                  "tie_word_embeddings": False}
#: --cpu-smoke: every dimension a multiple of 16 (FP8-eligible), seconds on a CPU
SHAPE_SMOKE = {**SHAPE, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
               "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 256, "max_position_embeddings": 64}
SHAPES = {"1b": SHAPE, "8b-layer": SHAPE_8B_LAYER, "smoke": SHAPE_SMOKE}
PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0}
DEVICE = "cuda"  # --cpu-smoke: "cpu"


def flops_per_token(shape: dict, seq: int) -> float:
    from nxd_models_llama.spec import config_from_dict
    from nxd_models_llama.spec import flops_per_token as fpt

    return fpt(config_from_dict(shape), seq_length=seq)


def nxd_model(shape: dict, compiled: bool, fused: tuple[str, ...] = (), fp8: str | None = None,
              dtype: str = "bfloat16") -> torch.nn.Module:
    """``fused``: ops run by Liger-Kernel (nxd_tensor_parallel.fused_kernels); ``fp8``: nxd-fp8's recipe
    (the model transform, emulated on the CPU)."""
    import nxd
    from nxd_models_llama.spec import build, config_from_dict

    transforms = None if fp8 is None else {"fp8": {"recipe": fp8, "emulate": DEVICE == "cpu"}}
    nxd_config = nxd.neuronx_distributed_config(compile_config=compiled, model_transforms=transforms)
    config = config_from_dict({**shape, "dtype": dtype, "fused_kernels": fused})
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


def make_step(model: torch.nn.Module, ids: torch.Tensor, kind: str, autocast: bool = False,
              lr: float = 1e-4) -> Callable[[], torch.Tensor]:
    """One training step of ``model`` on ``ids`` (a tensor, or a callable giving the step's ids);
    returns the loss (on the device: never read back inside the step)."""
    model.to(DEVICE).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, fused=True)

    def step() -> torch.Tensor:
        batch = ids() if callable(ids) else ids
        with torch.autocast(DEVICE, dtype=torch.bfloat16, enabled=autocast):
            if kind == "titan":
                logits = model(batch)
                loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), batch.flatten())
            else:
                loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    return step


def synchronize() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def loss_curves(factories: dict, wanted: list[str], args: argparse.Namespace) -> dict[str, list[float]]:
    """Each variant trained ``--loss-steps`` steps from the same seed on the same learnable token
    chains (next = 5 * prev + 3 mod vocab, so the loss falls), one variant at a time; the losses
    are read back at the end. FP8's goal (issue 35): within 1% of bf16's over the last 50 steps."""
    from nxd_testing.reference import token_chain_batch

    curves: dict[str, list[float]] = {}
    for variant in wanted:
        torch.manual_seed(0)
        model, kind = factories[variant]()

        def ids(n=[0]) -> torch.Tensor:  # noqa: B006 - the step counter
            n[0] += 1
            return token_chain_batch(n[0], batch=args.batch, seq=args.seq, vocab=args.vocab, mult=5,
                                     add=3)[0].to(DEVICE)

        step = make_step(model, ids, kind.removesuffix("-amp"), autocast=kind.endswith("-amp"), lr=3e-4)
        losses = torch.stack([step() for _ in range(args.loss_steps)]).float().tolist()
        curves[variant] = losses
        del model, step
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
    base = wanted[0]
    tail = max(1, min(50, args.loss_steps // 4))
    for variant, losses in curves.items():
        mean = sum(losses[-tail:]) / tail
        ref = sum(curves[base][-tail:]) / tail
        print(f"{variant:26} loss {losses[0]:.4f} -> {losses[-1]:.4f}; mean of last {tail} {mean:.4f} "
              f"({mean / ref - 1:+.2%} vs {base})")
    return curves


def moe_experts(args: argparse.Namespace) -> list[dict]:
    """nxd-moe's ExpertMLPs forward + backward at Mixtral-8x7B's expert shape (8 experts, top-2 of
    batch x seq tokens, --moe-hidden / --moe-intermediate): torch._grouped_mm vs one matmul pair per
    expert, bf16, the same weights and token counts; steps alternated."""
    from nxd_moe.experts import ExpertMLPs

    tokens = args.batch * args.seq * 2  # top-2
    counts = [tokens // 8] * 8
    x = torch.randn(tokens, args.moe_hidden, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
    runs: dict[str, Callable[[], None]] = {}
    for mode in ("grouped", "loop"):
        torch.manual_seed(0)
        experts = ExpertMLPs(8, args.moe_hidden, args.moe_intermediate, dtype=torch.bfloat16, device=DEVICE,
                             grouped_gemm=mode)

        def run(experts=experts) -> None:
            experts(x, counts).float().pow(2).mean().backward()

        runs[mode] = run
    times: dict[str, list[float]] = {m: [] for m in runs}
    for _ in range(args.warmup):
        for run in runs.values():
            run()
    for _ in range(args.steps):
        for mode, run in runs.items():
            synchronize()
            t0 = time.perf_counter()
            run()
            synchronize()
            times[mode].append(time.perf_counter() - t0)
    flops = 3 * 2 * tokens * 3 * args.moe_hidden * args.moe_intermediate  # fwd + 2x bwd, gate/up/down
    rows = []
    for mode, t in times.items():
        median = sorted(t)[len(t) // 2]
        print(f"experts {mode:8} {median * 1e3:8.2f} ms  {flops / median / 1e12:7.1f} TFLOP/s")
        rows.append(dict(variant=f"experts-{mode}", step_s=median, times=t))
    return rows


def memory_allocated() -> int:
    return torch.cuda.memory_allocated() if DEVICE == "cuda" else 0


def device_name() -> str:
    return torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu (smoke)"


def versions() -> dict[str, str]:
    """torch / triton / torchao / transformers versions, for the figures' record (issue 35)."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for dist_name in ("torch", "triton", "torchao", "transformers", "torchtitan"):
        try:
            out[dist_name] = version(dist_name)
        except PackageNotFoundError:
            out[dist_name] = "absent"
    return out


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
    parser.add_argument("--shape", choices=sorted(SHAPES), default="1b", help="1b: Llama-3.2-1B; 8b-layer: Llama-3-8B layers")
    parser.add_argument("--loss-steps", type=int, default=0, help="train each variant this many steps on learnable "
                        "token chains and compare the loss curves (no timing)")
    parser.add_argument("--moe", action="store_true", help="time MoE experts: grouped GEMM vs a loop")
    parser.add_argument("--moe-hidden", type=int, default=4096)
    parser.add_argument("--moe-intermediate", type=int, default=14336)
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny shapes on the CPU, FP8 emulated: checks the "
                        "script, measures nothing")
    args = parser.parse_args()
    global DEVICE
    if args.cpu_smoke:
        DEVICE, args.shape = "cpu", "smoke"
        args.batch, args.seq, args.steps, args.warmup = 2, 32, 2, 1
        args.moe_hidden, args.moe_intermediate = 64, 128
        args.only = args.only or "nxd-eager,nxd-amp,nxd-fp8,nxd-fp8-rowwise"
        args.loss_steps = min(args.loss_steps, 4)
    elif not torch.cuda.is_available():
        print("bench_gpu.py needs a CUDA GPU (torch.cuda.is_available() is False); run it on a GPU machine "
              "(see docs/benchmarks.md), or --cpu-smoke to check the script", file=sys.stderr)
        return 2
    import torch.distributed as dist

    if not dist.is_initialized():  # nxd's parallel layers need a (one-rank) process group
        dist.init_process_group("nccl" if DEVICE == "cuda" else "gloo", init_method="tcp://127.0.0.1:0", rank=0,
                                world_size=1)
    if args.moe:
        rows = moe_experts(args)
        if args.json:
            import json

            with open(args.json, "w") as fh:
                json.dump(dict(meta=dict(device=device_name(), torch=torch.__version__), rows=rows), fh, indent=1)
        return 0
    base = SHAPES[args.shape]
    layers = args.layers if args.layers != SHAPE["num_hidden_layers"] else base["num_hidden_layers"]
    vocab = args.vocab if args.vocab != SHAPE["vocab_size"] else base["vocab_size"]
    args.vocab = vocab
    shape = {**base, "num_hidden_layers": layers, "vocab_size": vocab}
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
        # FP8 (issue 35): fp32 params + bf16 autocast (torchtitan's recipe numerics) without and with
        # nxd-fp8's FP8 linear layers (the LM head stays bf16)
        "nxd-amp": lambda: (nxd_model(shape, False, dtype="float32"), "hf-amp"),
        "nxd-compiled-amp": lambda: (nxd_model(shape, True, dtype="float32"), "hf-amp"),
        "nxd-fp8": lambda: (nxd_model(shape, False, fp8="tensorwise", dtype="float32"), "hf-amp"),
        "nxd-fp8-rowwise": lambda: (nxd_model(shape, False, fp8="rowwise", dtype="float32"), "hf-amp"),
        "nxd-compiled-fp8": lambda: (nxd_model(shape, True, fp8="tensorwise", dtype="float32"), "hf-amp"),
        "nxd-compiled-fp8-rowwise": lambda: (nxd_model(shape, True, fp8="rowwise", dtype="float32"), "hf-amp"),
    }
    DEFAULT_EXCLUDED = {"nxd-amp", "nxd-compiled-amp", "nxd-fp8", "nxd-fp8-rowwise", "nxd-compiled-fp8",
                        "nxd-compiled-fp8-rowwise"}  # the FP8 set runs when named (--only)
    wanted = args.only.split(",") if args.only else [n for n in factories if n not in DEFAULT_EXCLUDED]
    unknown = [n for n in wanted if n not in factories]
    if unknown:
        print(f"unknown variant(s) {', '.join(unknown)}; known: {', '.join(factories)}", file=sys.stderr)
        return 2
    if args.loss_steps:
        curves = loss_curves(factories, wanted, args)
        if args.json:
            import json

            with open(args.json, "w") as fh:
                json.dump(dict(meta=dict(device=device_name(), torch=torch.__version__, shape=args.shape,
                                         layers=layers, batch=args.batch, seq=args.seq), curves=curves), fh)
        return 0
    ids = torch.randint(0, args.vocab, (args.batch, args.seq), device=DEVICE)
    name = device_name()
    peak = next((v for k, v in PEAK_TFLOPS.items() if k in name), None)
    fpt = flops_per_token(shape, args.seq)
    tokens = args.batch * args.seq
    print(f"{name}, torch {torch.__version__}, batch {args.batch} x {args.seq}, layers {layers}, "
          f"vocab {args.vocab}, {fpt / 1e9:.2f} GFLOP/token")
    # Every variant stays resident (about 14 GiB each at the 1B shape with AdamW states: use --only
    # to fit) and the timed steps go round-robin, so drift hits all alike. A variant's peak memory is
    # its resident bytes (weights, grads, optimizer state after warm-up) plus its largest step transient.
    steps: dict[str, Callable[[], None]] = {}
    resident: dict[str, int] = {}
    for variant in wanted:
        before = memory_allocated()
        try:
            model, kind = factories[variant]()
        except ImportError as exc:  # a peer that is not installed: say so, run the rest
            print(f"{variant}: skipped ({type(exc).__name__}: {exc})")
            continue
        steps[variant] = make_step(model, ids, kind.removesuffix("-amp"), autocast=kind.endswith("-amp"))
        for _ in range(args.warmup):  # compiles, allocates optimizer state
            steps[variant]()
        synchronize()
        resident[variant] = memory_allocated() - before
    results: dict[str, list[float]] = {v: [] for v in steps}
    transient: dict[str, int] = dict.fromkeys(steps, 0)
    for _ in range(args.steps):
        for variant, step in steps.items():
            if DEVICE == "cuda":
                torch.cuda.reset_peak_memory_stats()
            base = memory_allocated()
            t0 = time.perf_counter()
            step()
            synchronize()
            results[variant].append(time.perf_counter() - t0)
            peak_now = torch.cuda.max_memory_allocated() if DEVICE == "cuda" else base
            transient[variant] = max(transient[variant], peak_now - base)
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

        meta = dict(gpu=name, torch=torch.__version__, batch=args.batch, seq=args.seq, layers=layers,
                    vocab=args.vocab, shape=args.shape, gflop_per_token=fpt / 1e9, versions=versions())
        with open(args.json, "w") as fh:
            json.dump(dict(meta=meta, rows=rows), fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
