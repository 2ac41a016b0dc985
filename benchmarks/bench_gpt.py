"""One training step (forward + backward + AdamW) of the nxd GPT at TP=1 next to transformers'
GPT2LMHeadModel: same weights, same batch, same optimizer settings, steps interleaved (order
alternating) so that machine noise hits both alike. Ratio = nxd time / transformers time (goal <= 1.0).

Run: .venv/bin/python benchmarks/bench_gpt.py [--steps 6] [--seq 128] [--batch 4]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from transformers import GPT2Config as HFConfig  # noqa: E402
from transformers import GPT2LMHeadModel as HFGPT2  # noqa: E402
from transformers.utils import logging  # noqa: E402

from nxd_models_gpt import GPTConfig, GPTForCausalLM, load_hf_checkpoint  # noqa: E402

# dropout off on both sides: the step is then deterministic and the losses comparable
CONFIG = dict(vocab_size=4096, n_embd=256, n_layer=4, n_head=8, n_positions=1024, resid_pdrop=0.0, embd_pdrop=0.0,
              attn_pdrop=0.0, bos_token_id=None, eos_token_id=None)


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
    hf = HFGPT2(HFConfig(**CONFIG, attn_implementation="sdpa")).float()
    with tempfile.TemporaryDirectory() as tmp:
        hf.save_pretrained(tmp)
        ours = GPTForCausalLM(GPTConfig.from_dict(hf.config.to_dict()))
        load_hf_checkpoint(ours, tmp)
    opt_kw = dict(lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1, foreach=True)
    runs = {"transformers GPT2LMHeadModel": (hf, torch.optim.AdamW(hf.parameters(), **opt_kw), hf_step),
            "nxd GPTForCausalLM (TP=1)": (ours, torch.optim.AdamW(ours.parameters(), **opt_kw), nxd_step)}
    g = torch.Generator().manual_seed(1)
    times: dict[str, list[float]] = {name: [] for name in runs}
    losses: dict[str, list[float]] = {name: [] for name in runs}
    for step in range(args.warmup + args.steps):
        ids = torch.randint(0, CONFIG["vocab_size"], (args.batch, args.seq), generator=g)
        labels = torch.randint(0, CONFIG["vocab_size"], (args.batch, args.seq), generator=g)
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
    base = statistics.median(times["transformers GPT2LMHeadModel"])
    print(f"GPT-2 {CONFIG['n_layer']}L h{CONFIG['n_embd']} vocab {CONFIG['vocab_size']}, "
          f"batch {args.batch} x seq {args.seq}, fp32, {torch.get_num_threads()} threads, median of {args.steps} steps")
    print(f"{'implementation':34s} {'ms/step':>9s} {'tokens/s':>10s} {'ratio':>7s}")
    for name in runs:
        t = statistics.median(times[name])
        print(f"{name:34s} {t * 1e3:9.1f} {tokens / t:10.0f} {t / base:7.3f}")
    drift = max(abs(a - b) for a, b in zip(*losses.values()))
    print(f"max |loss difference| over {len(losses[name])} steps (same weights, batches, AdamW): {drift:.2e}")


if __name__ == "__main__":
    main()
