"""LR schedule values, and `nxd plot` drawing a PNG from metrics files."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from nxd_training.cli import PLOT
from nxd_training.schedules import make_lr_fn, make_scheduler


def test_linear_warmup_then_decay() -> None:
    fn = make_lr_fn("LinearAnnealingWithWarmUp", 1.0, max_steps=12, warmup_steps=3, min_lr=0.2)
    assert [round(fn(s), 6) for s in range(3)] == [0.25, 0.5, 0.75]
    assert fn(3) == 1.0 and fn(12) == pytest.approx(0.2) and fn(50) == pytest.approx(0.2)
    assert fn(7) == pytest.approx(1.0 - 0.8 * 4 / 9)


def test_cosine_floor_and_nemo_constant_steps() -> None:
    fn = make_lr_fn("CosineAnnealing", 2.0, max_steps=10, warmup_steps=0, min_lr=0.5)
    assert fn(0) == 2.0 and fn(5) == pytest.approx(0.5 + 1.5 * 0.5) and fn(10) == pytest.approx(0.5)
    # NeMo: constant_steps hold min_lr at the END; decay over max - warmup - constant steps
    fn = make_lr_fn("CosineAnnealing", 2.0, max_steps=12, warmup_steps=2, min_lr=0.5, constant_steps=4)
    assert [fn(s) for s in (0, 1, 2)] == [0.0, 1.0, 2.0]
    assert fn(5) == pytest.approx(0.5 + 1.5 * 0.5 * (1 + math.cos(math.pi * 3 / 6)))
    assert fn(8) == pytest.approx(0.5) and fn(9) == fn(12) == fn(30) == 0.5
    # NxDT's megatron_gpt: warmup 750 + constant 80000 > max_steps 20000 -> min_lr after warmup
    fn = make_lr_fn("CosineAnnealing", 1.5e-4, max_steps=20000, warmup_steps=750, min_lr=1e-5, constant_steps=80000)
    assert fn(375) == pytest.approx(0.75e-4) and fn(751) == fn(19999) == 1e-5


def test_constant_and_lambda_lr() -> None:
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=0.1)
    sched = make_scheduler(opt, make_lr_fn("constant", 0.1, None, warmup_steps=1), 0.1)
    seen = []
    for _ in range(3):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert seen == pytest.approx([0.05, 0.1, 0.1])


def test_plot_writes_png(tmp_path: Path) -> None:
    runs = []
    for name, slope in (("a", 0.1), ("b", 0.2)):
        run = tmp_path / name
        run.mkdir()
        lines = [{"step": s, "split": "train", "loss": 5 - slope * s, "tokens_per_s": 100.0 + s} for s in range(1, 11)]
        lines.append({"step": 10, "split": "valid", "loss": 4.0})
        (run / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
        runs.append(str(run))
    out = tmp_path / "curves.png"
    args = type("Args", (), {"runs": runs, "output": str(out), "metrics": "loss,tokens_per_s"})()
    assert PLOT.run(args) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "metrics.jsonl").write_text("")
    args.runs = [str(empty)]
    assert PLOT.run(args) == 2
