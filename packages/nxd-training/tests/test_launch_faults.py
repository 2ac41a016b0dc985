"""Fault injection around the launch: a second run into a live run's directory is refused, SIGTERM
to `nxd train` stops torchrun and every rank, a failing rank leaves torchrun's error file, and a
rank that stops taking part in collectives ends the job within distributed_strategy.collective_timeout."""

from __future__ import annotations

import json
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
from fault_hooks import rank1_dies_env

CODE = "import sys; from nxd.cli import main; sys.exit(main())"


def _nxd_train(config_path: Path, *overrides: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", CODE, "train", str(config_path), *overrides],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})


def _ranks(launcher: subprocess.Popen) -> list[psutil.Process]:
    return [k for k in psutil.Process(launcher.pid).children(recursive=True)
            if "nxd_training.worker" in " ".join(k.cmdline())]


def _wait_for_training(launcher: subprocess.Popen, log_dir: Path, steps: int = 0) -> None:
    """Until the run logged ``steps`` steps (0: until its log exists)."""
    deadline = time.monotonic() + 300
    metrics = log_dir / "metrics.jsonl"
    while not metrics.exists() or steps and len(metrics.read_text().splitlines()) < steps:
        assert launcher.poll() is None, launcher.stdout.read()
        assert time.monotonic() < deadline, "the run did not start training in time"
        time.sleep(0.2)


#: Fault injection through the interpreter's startup hook (the ranks inherit PYTHONPATH from
#: torchrun): on SIGUSR1, rank 1's main thread sleeps where it is and never enters another collective.
HANG_ON_SIGUSR1 = """
import os, signal, time
if os.environ.get("RANK") == "1" and os.environ.get("TORCHELASTIC_RUN_ID"):
    signal.signal(signal.SIGUSR1, lambda *_: time.sleep(10**6))
"""


@pytest.mark.slow
def test_second_writer_is_refused_sigterm_stops_every_rank_and_a_hung_rank_times_out(make_config, tmp_path: Path) -> None:
    """One directory, two launches (launches are the expensive part of these tests): a second writer
    is refused while the first runs, SIGTERM stops it and every rank, and the released directory
    takes a new run, whose rank 1 then stops taking part in collectives: with
    ``collective_timeout: 10`` rank 0 fails in the DP group's all-reduce and the job ends."""
    log_dir = tmp_path / "run"
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(make_config(
        trainer={"max_steps": 100000}, distributed_strategy={"tensor_model_parallel_size": 1},
        exp_manager={"explicit_log_dir": str(log_dir), "create_checkpoint_callback": False})))
    first = _nxd_train(path)
    try:
        _wait_for_training(first, log_dir)
        ranks = _ranks(first)
        assert len(ranks) >= 2
        second = _nxd_train(path, "trainer.max_steps=2")
        out, _ = second.communicate(timeout=300)
        assert second.returncode == 2, out
        assert f"{log_dir} is in use by a running nxd train (pid {first.pid}" in out and "Traceback" not in out
        assert "writing to" not in out  # a refused run says nothing about writing
        first.send_signal(signal.SIGTERM)
        out, _ = first.communicate(timeout=120)
        # a scheduler's stop: no rank is blamed, torchrun's SignalException traceback is kept aside
        assert first.returncode == 128 + signal.SIGTERM, out
        assert out.strip().splitlines()[-1].startswith("nxd train: stopped by SIGTERM at step "), out[-3000:]
        assert "Traceback" not in out[out.index("nxd train: writing to"):], out[-3000:]
        gone, alive = psutil.wait_procs(ranks, timeout=60)
        assert not alive, f"ranks still running after SIGTERM to nxd train: {[p.pid for p in alive]}"
    finally:
        if first.poll() is None:
            first.kill()
    # the lock went with its holder: the directory takes the next run
    (log_dir / "metrics.jsonl").unlink()
    _hung_rank_ends_the_job(path, log_dir, tmp_path)


@pytest.mark.slow
def test_sigkill_of_nxd_train_takes_torchrun_and_every_rank_with_it(make_config, tmp_path: Path) -> None:
    """A preempted job (SIGKILL to `nxd train`, nothing can be forwarded): torchrun's agent gets
    SIGTERM from the kernel (parent-death signal) and the ranks die with the agent (docs/training.md)."""
    log_dir = tmp_path / "run"
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(make_config(
        trainer={"max_steps": 100000}, distributed_strategy={"tensor_model_parallel_size": 1},
        exp_manager={"explicit_log_dir": str(log_dir), "create_checkpoint_callback": False})))
    job = _nxd_train(path)
    try:
        _wait_for_training(job, log_dir)
        children = psutil.Process(job.pid).children(recursive=True)
        ranks = [k for k in children if "nxd_training.worker" in " ".join(k.cmdline())
                 and "torch.distributed.run" not in " ".join(k.cmdline())]
        assert len(ranks) == 2, [k.cmdline() for k in children]
        job.kill()
        start = time.monotonic()
        _, alive = psutil.wait_procs(children, timeout=60)
        elapsed = time.monotonic() - start
    finally:
        if job.poll() is None:
            job.kill()
        job.communicate()
    assert not alive, f"still running after SIGKILL to nxd train: {[(p.pid, p.cmdline()[-2:]) for p in alive]}"
    print(f"SIGKILL of nxd train: torchrun and 2 ranks gone {elapsed:.1f}s later")


@pytest.mark.slow
@pytest.mark.parametrize(("death", "line"), [
    ("segv", r"nxd train: rank 1 failed first: it was killed by SIGSEGV \(exit code -11\) at step \d+ of 1000$"),
    ("exit0", r"nxd train: rank 1 failed first: it exited with code 0 at step \d+ of 1000 without finishing$"),
])
def test_the_last_line_names_the_rank_that_failed_first(make_config, tmp_path: Path, death: str, line: str) -> None:
    """torchrun's "Root Cause" names rank 0 ("Connection closed by peer") when rank 1 dies; nxd
    train's last line names rank 1, how and at which step."""
    import re

    log_dir = tmp_path / "run"
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(make_config(
        trainer={"max_steps": 1000, "log_every_n_steps": 1}, distributed_strategy={"tensor_model_parallel_size": 1},
        exp_manager={"explicit_log_dir": str(log_dir), "create_checkpoint_callback": False})))
    job = _nxd_train(path, env=rank1_dies_env(tmp_path, log_dir / "metrics.jsonl", death))
    try:
        out, _ = job.communicate(timeout=400)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode != 0, out
    last = out.strip().splitlines()[-1]
    assert re.match(line, last), f"last line: {last!r}\n{out[-4000:]}"


@pytest.mark.slow
def test_a_resume_that_fails_on_one_rank_claims_nothing(make_config, tmp_path: Path) -> None:
    """Rank 1's shard of the newest checkpoint is damaged: rank 0 loads its own, but "resumed from"
    is printed only once every rank loaded, so it never appears; the last line names rank 1."""
    log_dir = tmp_path / "run"
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(make_config(
        trainer={"max_steps": 2}, exp_manager={"explicit_log_dir": str(log_dir), "resume_if_exists": True,
                                               "checkpoint_callback_params": {"every_n_train_steps": 2}})))
    first = _nxd_train(path)
    out, _ = first.communicate(timeout=400)
    assert first.returncode == 0, out
    shard = next((log_dir / "checkpoints").glob("*/model/dp_rank_00_tp_rank_01_pp_rank_00.pt"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    again = _nxd_train(path, "trainer.max_steps=4")
    out, _ = again.communicate(timeout=400)
    assert again.returncode != 0, out
    assert "resumed from" not in out, out[-4000:]
    last = out.strip().splitlines()[-1]
    assert last.startswith("nxd train: rank 1 failed first: it raised CorruptCheckpointError: "), out[-4000:]


def test_worker_failure_writes_torchruns_error_file(tmp_path: Path) -> None:
    error_file = tmp_path / "error.json"
    proc = subprocess.run([sys.executable, "-m", "nxd_training.worker", str(tmp_path / "missing.yaml")],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "TORCHELASTIC_ERROR_FILE": str(error_file)})
    assert proc.returncode != 0
    message = json.loads(error_file.read_text())["message"]
    assert "missing.yaml" in message["message"] and "Traceback" in message["extraInfo"]["py_callstack"]


def _hung_rank_ends_the_job(path: Path, log_dir: Path, tmp_path: Path) -> None:
    timeout, margin = 10, 40  # margin: the failing rank's exit, torchrun's monitor and teardown on 2 busy cores
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(HANG_ON_SIGUSR1)
    paths = os.pathsep.join(p for p in (str(hooks), os.environ.get("PYTHONPATH")) if p)
    job = _nxd_train(path, f"distributed_strategy.collective_timeout={timeout}", env={"PYTHONPATH": paths})
    try:
        _wait_for_training(job, log_dir)
        ranks = _ranks(job)
        hung = next(p for p in ranks if p.environ().get("RANK") == "1")
        hung.send_signal(signal.SIGUSR1)  # rank 1 now sleeps; rank 0 waits in the DP group's all-reduce
        start = time.monotonic()
        out, _ = job.communicate(timeout=timeout + 120)
        elapsed = time.monotonic() - start
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode != 0, out
    assert elapsed < timeout + margin, f"the job took {elapsed:.1f}s to end after rank 1 hung\n{out}"
    assert re.search(r"rank 0 \(node 0, local rank 0\): .* did not complete within "
                     r"distributed_strategy.collective_timeout=10s", out), out
    # the last line blames the rank that never came, not the one that waited, and says where it was
    last = out.strip().splitlines()[-1]
    assert re.match(r"nxd train: rank 1 stopped taking part first \(hung: it reported no error\): rank 0 waited "
                    r"distributed_strategy.collective_timeout=10s for it in .+; when stopped, rank 1 was in "
                    r"hooks/sitecustomize.py:\d+ in <lambda>", last), out[-4000:]
    _, alive = psutil.wait_procs(ranks, timeout=30)
    assert not alive, f"ranks still running: {[p.pid for p in alive]}"
    print(f"hung rank -> job ended in {elapsed:.1f}s (collective_timeout={timeout}s)")


@pytest.mark.slow
def test_a_stopped_rank_is_named_as_hung_within_the_heartbeat_timeout(make_config, tmp_path: Path) -> None:
    """SIGSTOP of rank 1 mid-training: no error, no exit, no collective timeout for 30 minutes. Its
    heartbeat stops, so with ``heartbeat_timeout: 10`` nxd train names it as hung (stopped, not
    "killed by SIGKILL", which the teardown sends it), at its step, and ends the job with code 1."""
    timeout, margin = 10, 25  # margin: the watcher's poll, torchrun's teardown and exit on 2 busy cores
    log_dir = tmp_path / "run"
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(make_config(
        trainer={"max_steps": 100000}, distributed_strategy={"tensor_model_parallel_size": 1},
        exp_manager={"explicit_log_dir": str(log_dir), "create_checkpoint_callback": False})))
    job = _nxd_train(path, f"distributed_strategy.heartbeat_timeout={timeout}")
    try:
        _wait_for_training(job, log_dir, steps=2)
        ranks = _ranks(job)
        stopped = next(p for p in ranks if p.environ().get("RANK") == "1")
        stopped.send_signal(signal.SIGSTOP)
        start = time.monotonic()
        out, _ = job.communicate(timeout=timeout + 120)
        elapsed = time.monotonic() - start
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 1, out[-4000:]
    assert elapsed < timeout + margin, f"the job took {elapsed:.1f}s to end after rank 1 was stopped\n{out[-4000:]}"
    last = out.strip().splitlines()[-1]
    m = re.match(r"nxd train: rank 1 stopped taking part first \(hung: no heartbeat from its process for \d+s, over "
                 r"distributed_strategy.heartbeat_timeout=10s; its process was stopped \(SIGSTOP or job control\), so "
                 r"it could not say where\) at step (\d+) of 100000; nxd train stopped the job$", last)
    assert m, out[-4000:]
    logged = [json.loads(line)["step"] for line in (log_dir / "metrics.jsonl").read_text().splitlines()]
    assert int(m[1]) >= max(logged), (last, logged)  # the step it was in, not one before the log's last
    assert "Traceback" not in out[out.index("nxd train: writing to"):], out[-4000:]  # the teardown's: interrupted.log
    _, alive = psutil.wait_procs(ranks, timeout=30)
    assert not alive, f"ranks still running: {[p.pid for p in alive]}"
    print(f"SIGSTOP of rank 1 -> job ended in {elapsed:.1f}s (heartbeat_timeout={timeout}s)")
