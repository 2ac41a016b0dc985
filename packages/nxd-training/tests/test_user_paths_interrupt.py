"""Ctrl-C during a 2-rank ``nxd train`` (SIGINT to its process, as a terminal or a scheduler sends it): one line (stopped at step N, the last
complete checkpoint, the resume command) and no tracebacks; the printed command resumes, and no
step appears twice in metrics.jsonl or TensorBoard."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from nxd_training.exp_manager import read_metrics

CODE = "import sys; from nxd.cli import main; sys.exit(main())"


def _nxd(*args: str) -> subprocess.Popen:
    # its own session, like a shell's job: killpg below is the terminal's Ctrl-C
    return subprocess.Popen([sys.executable, "-c", CODE, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, start_new_session=True)


def _train_steps(run: Path) -> list[int]:
    path = run / "metrics.jsonl"
    if not path.exists():
        return []
    import json

    return [r["step"] for r in map(json.loads, path.read_text().splitlines()) if r.get("split") == "train"]


def _tensorboard_steps(run: Path) -> list[int]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run), size_guidance={"scalars": 0})
    events.Reload()
    return [e.step for e in events.Scalars("train/loss")]


def test_ctrl_c_prints_one_line_and_the_resume_logs_each_step_once(make_config, tmp_path: Path) -> None:
    run = tmp_path / "run"
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(make_config(
        trainer={"max_steps": 100000}, distributed_strategy={"tensor_model_parallel_size": 1},
        exp_manager={"explicit_log_dir": str(run), "resume_if_exists": True,
                     "checkpoint_callback_params": {"every_n_train_steps": 4, "save_top_k": 1}})))
    job = _nxd("train", str(path))
    try:
        deadline = time.monotonic() + 240
        while len(_train_steps(run)) < 6:  # past the checkpoint of step 4
            assert job.poll() is None, job.stdout.read()
            assert time.monotonic() < deadline, "training did not reach step 6 in time"
            time.sleep(0.1)
        # SIGINT to the nxd train process alone (kill -INT PID, Popen.send_signal, a scheduler); a terminal's
        # Ctrl-C reaches the same process only, since torchrun runs in its own session
        job.send_signal(signal.SIGINT)
        out, _ = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    assert job.returncode == 130, out
    after = out[out.index("nxd train: writing to"):].splitlines()[1:]
    assert len(after) == 1 and "Traceback" not in out, out
    stopped = max(_train_steps(run))
    line = after[0]
    assert line.startswith(f"nxd train: stopped at step {stopped}; last complete checkpoint: step "), line
    # the signal lands a few steps after step 6 on a fast machine: the checkpoint named is the newest
    # one saved every 4 steps up to where training stopped (the one before, if that save was cut short)
    saved = int(re.search(r"last complete checkpoint: step (\d+) ", line).group(1))
    assert saved % 4 == 0 and stopped - 8 < saved <= stopped, line
    command = shlex.split(line.split("resume with: ")[1])
    assert command == ["nxd", "train", str(run / "config.yaml")], line

    resumed = _nxd(*command[1:], f"trainer.max_steps={stopped + 1}")
    out, _ = resumed.communicate(timeout=240)
    assert resumed.returncode == 0, out
    assert "resumed from" in out
    steps = _train_steps(run)
    assert steps == list(range(1, stopped + 2)), steps  # steps after the checkpoint logged again after the resume: once
    assert [r["step"] for r in read_metrics(run)] == steps
    assert _tensorboard_steps(run) == steps  # the resumed writer purged the earlier 5..stopped


@pytest.mark.parametrize("log_every", [1, 5])
def test_ctrl_c_of_a_one_device_run_prints_the_same_line(make_config, tmp_path: Path, monkeypatch, capsys,
                                                         log_every: int) -> None:
    """One device trains inside ``nxd train`` itself: Ctrl-C there is a KeyboardInterrupt (raised
    here by the 4th step, as the terminal would) and ends with the same one line, naming the step
    reached even when the metrics log only every 5th (none logged yet)."""
    from nxd.cli import main
    from nxd_training.loop import Trainer

    step = Trainer.train_step

    def interrupted_at_step_4(self, it):
        if self.step == 3:
            raise KeyboardInterrupt
        return step(self, it)

    monkeypatch.setattr(Trainer, "train_step", interrupted_at_step_4)
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(make_config(
        trainer={"devices": 1, "max_steps": 10, "log_every_n_steps": log_every},
        distributed_strategy={"tensor_model_parallel_size": 1},
        exp_manager={"explicit_log_dir": str(tmp_path / "run"), "resume_if_exists": False,
                     "checkpoint_callback_params": {"every_n_train_steps": 2}})))
    assert main(["train", str(path)]) == 130
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        "nxd train: stopped at step 3; last complete checkpoint: step 2 "
        f"(tiny--step=2-consumed_samples=8); resume with: nxd train {tmp_path / 'run' / 'config.yaml'} "
        "exp_manager.resume_if_exists=true"], err
