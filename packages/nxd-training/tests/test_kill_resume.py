"""`nxd train` through torchrun: kill one rank mid-training, then the rerun continues from the
last complete checkpoint and recomputes exactly the losses the killed run had logged."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from nxd_training.exp_manager import read_metrics


def _nxd_train(config_path: Path, *overrides: str) -> subprocess.Popen:
    code = "import sys; from nxd.cli import main; sys.exit(main())"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-c", code, "train", str(config_path), *overrides],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def _workers(proc: subprocess.Popen) -> list[psutil.Process]:
    kids = psutil.Process(proc.pid).children(recursive=True)
    # the torchrun agent's command line names the worker module too; the ranks are its children
    return [k for k in kids if "nxd_training.worker" in (c := " ".join(k.cmdline())) and "torch.distributed.run" not in c]


def _complete_steps(ckpt: Path) -> list[int]:
    steps = []
    for tag in ckpt.glob("*") if ckpt.exists() else []:
        if (tag / "done").exists():
            steps.append(int(tag.name.split("step=")[1].split("-")[0]))
    return sorted(steps)


@pytest.mark.slow
def test_killed_rank_resumes_from_last_complete_checkpoint(make_config, tmp_path: Path) -> None:
    log_dir = tmp_path / "run"
    config = make_config(
        trainer={"max_steps": 400},
        distributed_strategy={"tensor_model_parallel_size": 1},
        exp_manager={"explicit_log_dir": str(log_dir), "resume_if_exists": True,
                     "checkpoint_callback_params": {"every_n_train_steps": 3, "save_top_k": 2}},
        model={"optim": {"sched": {"name": "linear", "max_steps": 400}}},
    )
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(config))
    proc = _nxd_train(path)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            metrics = log_dir / "metrics.jsonl"
            if metrics.exists() and len(read_metrics(log_dir)) >= 8 and _complete_steps(log_dir / "checkpoints"):
                break
            assert proc.poll() is None, proc.stdout.read()
            time.sleep(0.2)
        else:
            pytest.fail("the run did not reach step 8 in time")
        victims = _workers(proc)
        assert len(victims) == 2
        victims[-1].send_signal(signal.SIGKILL)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0, out
    logged = {r["step"]: r["loss"] for r in read_metrics(log_dir)}
    last_ckpt = _complete_steps(log_dir / "checkpoints")[-1]
    killed_at = max(logged)
    assert last_ckpt <= killed_at < 400

    # rerun to a few steps past the kill point: resumes at the last complete checkpoint
    target = killed_at + 2
    proc = _nxd_train(path, f"trainer.max_steps={target}")
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    assert f"(step {last_ckpt})" in out, out
    after = {r["step"]: r["loss"] for r in read_metrics(log_dir)}
    assert max(after) == target
    # steps recomputed after the resume equal what the killed run logged, bit for bit
    for step in range(last_ckpt + 1, killed_at + 1):
        assert after[step] == logged[step], (step, after[step], logged[step])


@pytest.mark.slow
def test_elastic_restart_resumes_in_the_same_launch(make_config, tmp_path: Path) -> None:
    """launcher.max_restarts=1: torchrun restarts the ranks after one is killed, the run resumes from
    its newest complete checkpoint and finishes (exit 0); the steps it recomputes equal the losses
    the killed attempt logged, and every step up to max_steps is logged."""
    log_dir = tmp_path / "run"
    steps = 30
    config = make_config(
        trainer={"max_steps": steps}, distributed_strategy={"tensor_model_parallel_size": 1},
        launcher={"max_restarts": 1},
        exp_manager={"explicit_log_dir": str(log_dir), "resume_if_exists": True, "resume_ignore_no_checkpoint": True,
                     "checkpoint_callback_params": {"every_n_train_steps": 3, "save_top_k": 2}},
    )
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(config))
    proc = _nxd_train(path)
    try:
        deadline = time.monotonic() + 240
        while not (log_dir / "metrics.jsonl").exists() or len(read_metrics(log_dir)) < 5 \
                or not _complete_steps(log_dir / "checkpoints"):
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline, "the run did not reach step 5 in time"
            time.sleep(0.1)
        victims = _workers(proc)
        killed_at = max(r["step"] for r in read_metrics(log_dir))
        victims[-1].send_signal(signal.SIGKILL)
        out, _ = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    records = [r for r in read_metrics(log_dir) if r.get("split", "train") == "train" and "loss" in r]
    first: dict[int, float] = {}
    repeated = []
    for r in records:
        if r["step"] in first:
            repeated.append(r["step"])
            assert r["loss"] == first[r["step"]], (r["step"], r["loss"], first[r["step"]])
        else:
            first[r["step"]] = r["loss"]
    assert sorted(first) == list(range(1, steps + 1)), sorted(first)
    # the restarted attempt resumed from a complete checkpoint at or after the one seen before the
    # kill (the rank may finish another between that read and the signal); it recomputes exactly the
    # steps the killed attempt logged past it
    resumed = [int(m) for m in re.findall(r"resumed from \S+ \(step (\d+)\)", out)]
    assert killed_at < steps, killed_at
    assert len(resumed) == 1 and resumed[0] % 3 == 0 and 3 <= resumed[0] < steps, (resumed, out)
    assert repeated == list(range(resumed[0] + 1, resumed[0] + 1 + len(repeated))), (resumed, repeated)
