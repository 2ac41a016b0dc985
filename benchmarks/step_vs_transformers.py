"""One training step (forward + backward + AdamW) of an nxd model family at TP=1 next to its
transformers twin: same weights, same batch, same optimizer settings, steps interleaved (order
alternating) so that machine noise hits both alike. Ratio = nxd time / transformers time (goal <= 1.0).
Shared by bench_llama.py, bench_gpt.py, bench_qwen3.py and bench_deepseek.py (each names its two
models and its shape)."""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from transformers.utils import logging  # noqa: E402


def hf_step(model: torch.nn.Module, opt: torch.optim.Optimizer, ids: torch.Tensor, labels: torch.Tensor) -> float:
    logits = model(ids).logits
    loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1))
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.item()


def nxd_step(model: torch.nn.Module, opt: torch.optim.Optimizer, ids: torch.Tensor, labels: torch.Tensor) -> float:
    loss = model(ids, labels=labels).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.item()


def spec_builder(spec_name: str) -> Callable[[torch.nn.Module, str], torch.nn.Module]:
    """``build_nxd`` for a registered model spec: built from the saved ``config.json`` at TP=1 and
    loaded through ``spec.load_hf``."""
    import json
    from pathlib import Path

    import nxd

    def build(hf: torch.nn.Module, hf_dir: str) -> torch.nn.Module:
        spec = nxd.get_model(spec_name)
        model = nxd.build_parallel_model(spec, json.loads((Path(hf_dir) / "config.json").read_text()))
        spec.load_hf(model, hf_dir)
        return model

    return build


def compare(description: str, shape: str, vocab_size: int, build_hf: Callable[[], torch.nn.Module],
            build_nxd: Callable[[torch.nn.Module, str], torch.nn.Module], names: tuple[str, str]) -> None:
    """``build_hf()``: the transformers model (fp32, sdpa); ``build_nxd(hf, hf_dir)``: the nxd model
    loaded from ``hf`` saved in ``hf_dir``; ``names``: (transformers, nxd) row labels."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=4)
    # One thread by default: on a shared 2-core box, 2 threads per process mostly measure contention.
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    logging.set_verbosity_error()
    torch.manual_seed(0)
    hf = build_hf()
    with tempfile.TemporaryDirectory() as tmp:
        hf.save_pretrained(tmp)
        ours = build_nxd(hf, tmp)
    opt_kw = dict(lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1, foreach=True)
    runs = {names[0]: (hf, torch.optim.AdamW(hf.parameters(), **opt_kw), hf_step),
            names[1]: (ours, torch.optim.AdamW(ours.parameters(), **opt_kw), nxd_step)}
    g = torch.Generator().manual_seed(1)
    times: dict[str, list[float]] = {name: [] for name in runs}
    losses: dict[str, list[float]] = {name: [] for name in runs}
    for step in range(args.warmup + args.steps):
        ids = torch.randint(0, vocab_size, (args.batch, args.seq), generator=g)
        labels = torch.randint(0, vocab_size, (args.batch, args.seq), generator=g)
        order = list(runs.items())
        if step % 2:  # alternate who goes first: caches and load bursts then favour neither
            order.reverse()
        for name, (model, opt, fn) in order:
            start = time.perf_counter()
            loss = fn(model, opt, ids, labels)
            if step >= args.warmup:
                times[name].append(time.perf_counter() - start)
            losses[name].append(loss)
    tokens = args.batch * args.seq
    base = statistics.median(times[names[0]])
    print(f"{shape} vocab {vocab_size}, batch {args.batch} x seq {args.seq}, fp32, {torch.get_num_threads()} threads, "
          f"median of {args.steps} steps")
    print(f"{'implementation':34s} {'ms/step':>9s} {'tokens/s':>10s} {'ratio':>7s}")
    for name in runs:
        t = statistics.median(times[name])
        print(f"{name:34s} {t * 1e3:9.1f} {tokens / t:10.0f} {t / base:7.3f}")
    drift = max(abs(a - b) for a, b in zip(*losses.values()))
    print(f"max |loss difference| over {len(losses[name])} steps (same weights, batches, AdamW): {drift:.2e}")
