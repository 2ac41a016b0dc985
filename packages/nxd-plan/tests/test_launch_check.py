"""``nxd train`` plans before launch (the ``nxd_plan_run`` hook): it prints the plan's one line,
refuses a layout the plan proves cannot fit a known device memory (naming the rank and the nearest
layouts that fit), and never refuses when the memory is unknown (CPU). Through the real command's
``--validate`` path (everything ``nxd train`` does before it starts ranks)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import yaml

from nxd.cli import main
from nxd_plan.planner import GIB, make_run_plan


def _config(corpus: dict[str, str], **ds) -> dict:
    """2 CPU ranks, replicated DP, a small Llama on the real quickstart data."""
    from nxd_plan.accuracy import measurable_config

    config = measurable_config(corpus, tempfile.mkdtemp(), world=2)
    config["trainer"].pop("profile")
    config["distributed_strategy"].update(ds)
    return config


def _write(config: dict) -> str:
    path = Path(tempfile.mkdtemp()) / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def test_train_prints_the_plan_and_refuses_what_cannot_fit(corpus, capsys) -> None:
    config = _config(corpus)
    path = _write(config)
    # CPU: memory unknown, the line is printed and nothing is refused
    assert main(["train", path, "--validate"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("nxd train: plan: "))
    assert "device memory unknown (not checked)" in line and "MiB/rank (rank 0)" in line and "step ~" in line

    # a memory between ZeRO-1's peak and this layout's: refused, ZeRO-1 proposed
    base = make_run_plan(config).max_peak
    zero1 = make_run_plan(_config(corpus, zero1=True)).max_peak
    assert zero1 < base
    memory = (base + zero1) / 2 / GIB
    assert main(["train", path, "--validate", "--device-memory", f"{memory:.6f}"]) == 2
    err = capsys.readouterr().err
    assert "the plan proves this layout cannot fit: rank 0 (pipeline stage 0) needs" in err, err
    assert "2 of 2 ranks are over (ranks 0-1)" in err
    assert "Nearest layouts that fit: " in err and "distributed_strategy.zero1=True" in err

    # a known memory that holds it: the line names it, exit 0
    assert main(["train", path, f"--device-memory={2 * base / GIB:.6f}", "--validate"]) == 0
    assert f"device memory {2 * base / 2**20:.2f} MiB" in capsys.readouterr().out
