"""Fault injection around the launch: a second run into a live run's directory is refused, SIGTERM
to `nxd train` stops torchrun and every rank, and a failing rank leaves torchrun's error file."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

CODE = "import sys; from nxd.cli import main; sys.exit(main())"


def _nxd_train(config_path: Path, *overrides: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", CODE, "train", str(config_path), *overrides],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})


@pytest.mark.slow
def test_second_writer_is_refused_and_sigterm_stops_every_rank(make_config, tmp_path: Path) -> None:
    log_dir = tmp_path / "run"
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(make_config(
        trainer={"max_steps": 100000}, distributed_strategy={"tensor_model_parallel_size": 1},
        exp_manager={"explicit_log_dir": str(log_dir), "create_checkpoint_callback": False})))
    first = _nxd_train(path)
    try:
        deadline = time.monotonic() + 300
        while not (log_dir / "metrics.jsonl").exists():
            assert first.poll() is None, first.stdout.read()
            assert time.monotonic() < deadline, "the first run did not start training in time"
            time.sleep(0.2)
        ranks = [k for k in psutil.Process(first.pid).children(recursive=True)
                 if "nxd_training.worker" in " ".join(k.cmdline())]
        assert len(ranks) >= 2
        second = _nxd_train(path, "trainer.max_steps=2")
        out, _ = second.communicate(timeout=300)
        assert second.returncode == 2, out
        assert f"{log_dir} is in use by a running nxd train (pid {first.pid}" in out and "Traceback" not in out
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=120)
        gone, alive = psutil.wait_procs(ranks, timeout=60)
        assert not alive, f"ranks still running after SIGTERM to nxd train: {[p.pid for p in alive]}"
    finally:
        if first.poll() is None:
            first.kill()
    # the lock went with its holder: the directory is usable again
    again = _nxd_train(path, "trainer.max_steps=1")
    out, _ = again.communicate(timeout=300)
    assert again.returncode == 0, out


def test_worker_failure_writes_torchruns_error_file(tmp_path: Path) -> None:
    error_file = tmp_path / "error.json"
    proc = subprocess.run([sys.executable, "-m", "nxd_training.worker", str(tmp_path / "missing.yaml")],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "TORCHELASTIC_ERROR_FILE": str(error_file)})
    assert proc.returncode != 0
    message = json.loads(error_file.read_text())["message"]
    assert "missing.yaml" in message["message"] and "Traceback" in message["extraInfo"]["py_callstack"]
