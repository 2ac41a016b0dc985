"""nxd-lora benchmark: LoRA step time and optimizer memory against full fine-tuning, and against
PEFT on transformers' LlamaForCausalLM (same weights, rank, targets and batch).

One process (a one-rank gloo group), four rows:
  * nxd Llama, full fine-tuning (AdamW over every parameter);
  * nxd Llama + nxd-lora (AdamW over the adapters);
  * transformers Llama, full fine-tuning;
  * transformers Llama + PEFT LoRA.
Step = forward + backward + AdamW step. Optimizer memory = bytes of AdamW state after a step.
Timing: ours and the peer are interleaved step by step with the order flipped every pair (ABBA),
median of --steps steps each (nxd-lora with PEFT, full FT with full FT).
Usage: python benchmarks/bench_lora.py [--steps 20] [--rank 16] [--hidden 256] [--layers 4]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

from nxd.transforms import parallelize_model

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def hf_config(args):
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=2048, hidden_size=args.hidden, intermediate_size=args.hidden * 8 // 3 // 8 * 8,
                       num_hidden_layers=args.layers, num_attention_heads=args.hidden // 32, num_key_value_heads=2,
                       max_position_embeddings=args.seq, bos_token_id=None, eos_token_id=None, pad_token_id=None)


def optimizer_bytes(opt: torch.optim.Optimizer) -> int:
    return sum(t.numel() * t.element_size() for state in opt.state.values() for t in state.values()
               if isinstance(t, torch.Tensor))


def make_step(model, params, data, hf: bool):
    """One training step (forward + backward + AdamW) and its optimizer."""
    opt = torch.optim.AdamW(params, lr=1e-4)

    def step():
        if hf:
            logits = model(input_ids=data["input_ids"]).logits
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), data["labels"].reshape(-1))
        else:
            loss = model(input_ids=data["input_ids"], labels=data["labels"]).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step, opt, sum(p.numel() for p in params)


def abba(a, b, steps: int) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """Time two step functions interleaved, flipping which goes first every pair (A B, B A, ...),
    so load drift and order effects on a shared machine hit both alike. Per step: (wall seconds,
    this thread's CPU seconds); with one torch thread the CPU time barely moves with machine load."""
    ta: list[tuple[float, float]] = []
    tb: list[tuple[float, float]] = []
    for i in range(steps):
        pair = ((a, ta), (b, tb)) if i % 2 == 0 else ((b, tb), (a, ta))
        for step, times in pair:
            t0, c0 = time.perf_counter(), time.thread_time()
            step()
            times.append((time.perf_counter() - t0, time.thread_time() - c0))
    return ta, tb


def measure(entries: dict, pairs: list[tuple[str, str]], steps: int) -> dict:
    """Each pair (ours, theirs) timed ABBA; median per variant."""
    for step, _, _ in entries.values():
        step()  # warm-up (allocates optimizer state)
    times = {}
    for ours, theirs in pairs:
        times[ours], times[theirs] = abba(entries[ours][0], entries[theirs][0], steps)
    return {name: {"step_s": statistics.median(t[0] for t in times[name]),
                   "cpu_s": statistics.median(t[1] for t in times[name]), "opt_mb": optimizer_bytes(opt) / 2**20,
                   "trainable": n} for name, (_, opt, n) in entries.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--batch", type=int, default=2)
    args = parser.parse_args()

    import peft
    import transformers
    from transformers import LlamaForCausalLM as HFLlama

    import nxd
    from nxd_lora import LoraConfig, LoRAModel
    from nxd_models_llama import LlamaConfig, LlamaForCausalLM, load_hf_checkpoint

    transformers.logging.set_verbosity_error()
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    nxd.neuronx_distributed_config(tensor_parallel_size=1)
    torch.set_num_threads(1)  # the shared test machine: fewer threads, less contention noise
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    data = {"input_ids": torch.randint(0, 2048, (args.batch, args.seq), generator=g),
            "labels": torch.randint(0, 2048, (args.batch, args.seq), generator=g)}
    with tempfile.TemporaryDirectory() as tmp:
        HFLlama(hf_config(args)).float().save_pretrained(tmp)

        def nxd_model():
            model = parallelize_model(LlamaForCausalLM(LlamaConfig.from_dict(hf_config(args).to_dict())))
            load_hf_checkpoint(model, tmp)
            return model

        def hf_model():
            return HFLlama.from_pretrained(tmp, dtype=torch.float32)

        entries = {}
        model = nxd_model()
        entries["nxd full FT"] = make_step(model, list(model.parameters()), data, hf=False)
        lora = LoRAModel(nxd_model(), LoraConfig(enable_lora=True, lora_rank=args.rank, lora_alpha=2 * args.rank,
                                                 target_modules=TARGETS))
        entries["nxd + nxd-lora"] = make_step(lora, [p for p in lora.parameters() if p.requires_grad], data, False)
        model = hf_model()
        entries["transformers full FT"] = make_step(model, list(model.parameters()), data, hf=True)
        pm = peft.get_peft_model(hf_model(), peft.LoraConfig(r=args.rank, lora_alpha=2 * args.rank,
                                                             target_modules=TARGETS))
        entries["transformers + PEFT"] = make_step(pm, [p for p in pm.parameters() if p.requires_grad], data, True)
        rows = measure(entries, [("nxd + nxd-lora", "transformers + PEFT"),
                                  ("nxd full FT", "transformers full FT")], args.steps)
    dist.destroy_process_group()

    print(f"\nLlama h={args.hidden} layers={args.layers} seq={args.seq} batch={args.batch}, LoRA r={args.rank} on "
          f"{', '.join(TARGETS)}; torch threads={torch.get_num_threads()}; median of {args.steps} ABBA-interleaved steps per pair")
    print(f"{'':24}{'step (ms)':>11}{'CPU (ms)':>10}{'optimizer MB':>14}{'trainable':>12}")
    for name, r in rows.items():
        print(f"{name:24}{r['step_s'] * 1e3:11.1f}{r['cpu_s'] * 1e3:10.1f}{r['opt_mb']:14.2f}{r['trainable']:12,}")
    ours, full, peer = rows["nxd + nxd-lora"], rows["nxd full FT"], rows["transformers + PEFT"]
    print("\nratios (lower is better for ours):")
    for label, other in (("nxd-lora / nxd full FT", full), ("nxd-lora / PEFT", peer)):
        print(f"  {label:25}  step time {ours['step_s'] / other['step_s']:.2f}x   "
              f"CPU time {ours['cpu_s'] / other['cpu_s']:.2f}x   optimizer memory {ours['opt_mb'] / other['opt_mb']:.3f}x")


if __name__ == "__main__":
    main()
