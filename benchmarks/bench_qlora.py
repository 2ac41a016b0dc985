"""QLoRA (NF4 base) against LoRA on the full-precision base: loss curves through ``nxd train`` on the
README's quickstart data, and the base's bytes per parameter. Not run in CI (minutes on 2 cores).

1. A base model: the quickstart Llama widened so every projection is whole NF4 scaler blocks per FSDP
   shard (hidden 256, ffn 768), pretrained ``--pretrain-steps`` steps on the quickstart corpus
   (``nxd train hub:quickstart``), exported to Hugging Face (``nxd ckpt convert``).
2. Two fine-tunes from that folder on the same corpus, same seed, same data order, FSDP over 2 ranks,
   fp32, r=16 on all seven projections: LoRA (``peft``), and QLoRA (``peft.quantize_base: nf4``).
   The adapters start identical (same seed), so the curves differ by the NF4 rounding of the base only.
Printed: the table (step, loss LoRA, loss QLoRA, difference), the final difference against the stated
tolerance, and the NF4 base bytes per parameter (``nxd plan``'s note).
Usage: python benchmarks/bench_qlora.py [--steps 100] [--pretrain-steps 150] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

#: the final-loss difference (QLoRA - LoRA, mean of the last 10 steps) this benchmark accepts:
#: QLoRA's paper reports NF4 matching 16-bit fine-tuning; here 2% of the loss
TOLERANCE = 0.02
MODEL = ["model.hidden_size=256", "model.ffn_hidden_size=768", "model.num_attention_heads=4", "model.num_kv_heads=2"]
COMMON = ["distributed_strategy.tensor_model_parallel_size=1", "trainer.val_check_interval=0",
          "exp_manager.create_tensorboard_logger=false", "generation=null"]
TARGETS = "[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj]"


def nxd(*args: str) -> str:
    out = subprocess.run([sys.executable, "-c", "import sys; from nxd.cli import main; sys.exit(main())", *args],
                         capture_output=True, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    if out.returncode:
        raise SystemExit(f"nxd {' '.join(args)} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return out.stdout


def losses(run: Path) -> dict[int, float]:
    records = (json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines())
    return {r["step"]: r["loss"] for r in records if r.get("split") == "train"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--pretrain-steps", type=int, default=150)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="bench_qlora_"))
    base_run, base_hf = out / "pretrain", out / "base_hf"
    if not (base_hf / "config.json").exists():
        nxd("train", "hub:quickstart", *MODEL, *COMMON, f"trainer.max_steps={args.pretrain_steps}",
            f"exp_manager.explicit_log_dir={base_run}", f"exp_manager.checkpoint_callback_params.every_n_train_steps="
            f"{args.pretrain_steps}")
        nxd("ckpt", "convert", "--from", "nxd", "--to", "hf", str(base_run), "--output", str(base_hf))
    fine_tune = [*MODEL, *COMMON, f"trainer.max_steps={args.steps}", "distributed_strategy.fsdp=true",
                 f"model.pretrained_checkpoint={base_hf}", "model.optim.lr=1e-3", "model.optim.sched.warmup_steps=0",
                 "exp_manager.create_checkpoint_callback=false", "+model_alignment_strategy.peft.lora_rank=16",
                 "+model_alignment_strategy.peft.lora_alpha=32", "+model_alignment_strategy.peft.lora_dropout=0.0",
                 f"+model_alignment_strategy.peft.target_modules={TARGETS}"]
    runs = {"LoRA": out / "lora", "QLoRA": out / "qlora"}
    nxd("train", "hub:quickstart", *fine_tune, f"exp_manager.explicit_log_dir={runs['LoRA']}")
    nxd("train", "hub:quickstart", *fine_tune, "+model_alignment_strategy.peft.quantize_base=nf4",
        f"exp_manager.explicit_log_dir={runs['QLoRA']}")
    plan = nxd("plan", "hub:quickstart", *fine_tune, "+model_alignment_strategy.peft.quantize_base=nf4")
    curves = {name: losses(run) for name, run in runs.items()}
    steps = sorted(curves["LoRA"])
    print(f"base: quickstart Llama (hidden 256, ffn 768, 4 layers) pretrained {args.pretrain_steps} steps; "
          f"fine-tunes: {args.steps} steps, FSDP x 2, fp32, r=16 on all projections")
    print("| step | loss LoRA | loss QLoRA | QLoRA - LoRA |\n|---|---|---|---|")
    shown = sorted({1, *range(10, steps[-1] + 1, max(1, steps[-1] // 10)), steps[-1]})
    for s in shown:
        a, b = curves["LoRA"][s], curves["QLoRA"][s]
        print(f"| {s} | {a:.4f} | {b:.4f} | {b - a:+.4f} |")
    last = steps[-10:]
    mean = {k: sum(c[s] for s in last) / len(last) for k, c in curves.items()}
    diff = (mean["QLoRA"] - mean["LoRA"]) / mean["LoRA"]
    print(f"mean loss of the last {len(last)} steps: LoRA {mean['LoRA']:.4f}, QLoRA {mean['QLoRA']:.4f}, "
          f"relative difference {diff:+.2%} (tolerance {TOLERANCE:.0%}): {'within' if abs(diff) <= TOLERANCE else 'OUTSIDE'}")
    for line in plan.splitlines():
        if "QLoRA:" in line:
            print(line.removeprefix("note: "))
    print(f"runs under {out}")


if __name__ == "__main__":
    main()
