"""Summarise a torch.profiler Chrome trace (``trainer.profile``'s output): GPU kernel time per
category and the top kernels, per profiled step.   python trace_summary.py TRACE.json STEPS"""

from __future__ import annotations

import json
import sys
from collections import Counter

CATEGORIES = (("attention", ("flash", "fmha", "attention")), ("optimizer", ("adam", "multi_tensor", "foreach")),
              ("matmul", ("gemm", "sm90", "cutlass", "nvjet", "cublas")), ("nccl", ("nccl",)),
              ("triton (fused)", ("triton",)), ("copy/cast", ("copy", "cast", "fill"))),


def category(name: str) -> str:
    low = name.lower()
    return next((cat for cat, keys in CATEGORIES[0] if any(k in low for k in keys)), "other elementwise")


def main() -> None:
    path, steps = sys.argv[1], int(sys.argv[2])
    events = [e for e in json.load(open(path))["traceEvents"] if e.get("cat") == "kernel" and "dur" in e]
    by_cat, by_name = Counter(), Counter()
    for e in events:
        by_cat[category(e["name"])] += e["dur"]
        by_name[e["name"][:90]] += e["dur"]
    total = sum(by_cat.values())
    span = (max(e["ts"] + e["dur"] for e in events) - min(e["ts"] for e in events)) / steps if events else 0
    print(f"GPU kernel time per step {total / steps / 1e3:.1f} ms over a {span / 1e3:.1f} ms span, {len(events) // steps} kernels")
    for cat, dur in by_cat.most_common():
        print(f"  {cat:20} {dur / steps / 1e3:8.2f} ms  {dur / total:6.1%}")
    for name, dur in by_name.most_common(15):
        print(f"  {dur / steps / 1e3:8.2f} ms  {name}")


if __name__ == "__main__":
    main()
