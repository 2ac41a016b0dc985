"""The heartbeat watch's decision (nxd_training.hang_watch) from beats and a clock, its UDP listener
with real datagrams, and the last line it leads to. test_launch_faults.py proves it through
`nxd train` with a SIGSTOPped rank."""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

from nxd_training import heartbeat
from nxd_training.config import load_config
from nxd_training.failure import heartbeat_line
from nxd_training.hang_watch import STEP_FACTOR, Hang, HangWatch, Watcher
from nxd_training.rank_status import STATUS_DIR


def _train(watch: HangWatch, now: float, done: dict[int, int], phase: str = "train") -> None:
    for rank, d in done.items():
        watch.beat(rank, 100 + rank, d + 1, d, phase, now)


def test_a_rank_without_heartbeats_is_named_after_the_timeout_unless_it_died() -> None:
    watch = HangWatch(timeout=10)
    _train(watch, 0.0, {0: 0, 1: 0})  # start-up: no step yet, but beats count from the first one
    watch.beat(0, 100, 1, 0, None, 9.0)
    assert watch.check(10.0) is None
    watch.beat(0, 100, 1, 0, None, 15.0)
    hang = watch.check(10.5)
    assert hang is not None and (hang.kind, hang.ranks, hang.bound) == ("silent", (1,), 10)
    assert hang.beats[1].step == 1 and hang.beats[1].done == 0
    assert watch.check(10.5, alive=lambda pid: pid != 101) is None  # it died: torchrun reports that
    watch.beat(1, 999, 1, None, None, 11.0)  # a restarted rank (new process) starts afresh
    assert watch.check(12.0) is None
    watch.pause(30.0)  # nxd train itself did not run for 30 s (suspended): no rank was silent meanwhile
    assert watch.check(50.0) is None and watch.check(56.0) is not None


def test_a_stall_is_armed_by_the_first_step_bounded_by_the_longest_step_and_paused_by_saves() -> None:
    watch = HangWatch(timeout=10)
    _train(watch, 0.0, {0: 0, 1: 0})
    for t in range(1, 100):  # a 100 s first compile: beats, no step completed, not armed
        _train(watch, float(t), {0: 0, 1: 0})
    assert watch.check(100.0) is None
    _train(watch, 100.0, {0: 1, 1: 1})  # step 1 done: armed; its time (the compile) is not a step time
    _train(watch, 102.0, {0: 2, 1: 2})  # a 2 s step: bound max(10, 10 x 2) = 20
    assert watch.stall_bound() == STEP_FACTOR * 2
    for t in range(103, 123):
        _train(watch, float(t), {0: 2, 1: 2})
    assert watch.check(121.5) is None
    hang = watch.check(122.5)
    assert hang is not None and (hang.kind, hang.ranks, hang.bound) == ("stalled", (0, 1), 20.0)
    # the same wait in a checkpoint save is no stall (the collective timeout bounds saves)
    saving = HangWatch(timeout=10)
    _train(saving, 0.0, {0: 0, 1: 0})
    _train(saving, 1.0, {0: 1, 1: 1})
    _train(saving, 2.0, {0: 1, 1: 1}, phase="checkpoint")
    for t in range(3, 60):
        _train(saving, float(t), {0: 1, 1: 1}, phase="checkpoint")
    assert saving.check(60.0) is None
    # one rank still completing steps: no stall
    _train(saving, 60.0, {0: 1, 1: 1})
    _train(saving, 75.0, {0: 2, 1: 1})
    assert saving.check(75.5) is None


def test_the_watcher_hears_real_beats_ignores_strays_and_names_the_silent_rank() -> None:
    watcher = Watcher(timeout=0.6)
    env = watcher.env()
    host, port = env[heartbeat.ADDR_ENV].rsplit(":", 1)
    found = threading.Event()
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    watcher.start(lambda hang: found.set())
    try:
        for _ in range(3):
            for rank in (0, 1):
                sock.sendto(heartbeat.message(env[heartbeat.TOKEN_ENV], rank, {"step": 4, "done": 3, "phase": "train"}),
                            (host, int(port)))
            sock.sendto(heartbeat.message("not-the-token", 7, {"step": 1}), (host, int(port)))
            sock.sendto(b"garbage", (host, int(port)))
            found.wait(0.2)
        for _ in range(10):  # only rank 0 beats on
            sock.sendto(heartbeat.message(env[heartbeat.TOKEN_ENV], 0, {"step": 4, "done": 3, "phase": "train"}),
                        (host, int(port)))
            if found.wait(0.2):
                break
    finally:
        watcher.stop()
        sock.close()
    assert found.is_set() and watcher.hang is not None
    assert (watcher.hang.kind, watcher.hang.ranks) == ("silent", (1,))  # rank 7's stray beats never counted
    assert watcher.hang.beats[1].pid == os.getpid() and watcher.hang.states[1] in ("R", "S")


def test_a_rank_seen_stopped_is_remembered_for_a_job_that_ends_another_way(monkeypatch) -> None:
    """A shorter collective timeout ends the job before the heartbeat timeout: the rank seen stopped
    (no beats, state T) is still what the last line names, not the SIGKILL that reaped it, and that
    SIGKILL comes as soon as another rank exited."""
    import json
    import signal
    import subprocess
    import time

    from nxd_training import hang_watch

    monkeypatch.setattr(hang_watch, "SEEN_STOPPED_S", 0.2)
    child = subprocess.Popen(["sleep", "60"])
    watcher = Watcher(timeout=3)  # beats every 0.3 s; seen stopped after 0.9 s quiet
    env = watcher.env()
    host, port = env[heartbeat.ADDR_ENV].rsplit(":", 1)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)

    def beat(rank: int, pid: int) -> None:
        sock.sendto(json.dumps({"token": env[heartbeat.TOKEN_ENV], "rank": rank, "pid": pid, "step": 5, "done": 4,
                                "phase": "train"}).encode(), (host, int(port)))

    watcher.start(lambda hang: None)
    try:
        beat(1, child.pid)
        child.send_signal(signal.SIGSTOP)
        deadline = time.monotonic() + 1.8
        while time.monotonic() < deadline:
            beat(0, os.getpid())
            time.sleep(0.1)
        seen = watcher.seen_stopped()
        # another rank exits (the collective timeout ended the job): the stopped one, which cannot run
        # torchrun's SIGTERM, is killed at once instead of after torchrun's 30 s grace
        gone = subprocess.Popen(["true"])
        gone.wait()
        beat(2, gone.pid)
        assert child.wait(timeout=5) == -signal.SIGKILL
    finally:
        watcher.stop()
        sock.close()
        child.kill()
        child.wait()
    assert seen is not None and (seen.ranks, seen.states, seen.stopped_job) == ((1,), {1: "T"}, False)
    assert seen.beats[1].step == 5


def test_a_rank_beats_at_once_when_its_step_changes(monkeypatch) -> None:
    """A rank stopped just after a step began is reported at that step: a change is sent within
    MIN_GAP_S, not a beat interval later (here an hour)."""
    import json
    import time

    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(5)
    monkeypatch.setenv(heartbeat.ADDR_ENV, f"127.0.0.1:{sock.getsockname()[1]}")
    monkeypatch.setenv(heartbeat.TOKEN_ENV, "t0k")
    monkeypatch.setenv(heartbeat.INTERVAL_ENV, "3600")
    progress, changed = {"step": 4, "done": 3, "phase": "train"}, threading.Event()
    try:
        assert heartbeat.start(3, progress, changed) is not None
        first = json.loads(sock.recv(4096))
        assert (first["token"], first["rank"], first["pid"], first["step"]) == ("t0k", 3, os.getpid(), 4)
        progress.update(step=5, done=4)
        start = time.monotonic()
        changed.set()
        second = json.loads(sock.recv(4096))
        assert (second["step"], second["done"]) == (5, 4) and time.monotonic() - start < 2
    finally:
        sock.close()


def _beats(step: int, ranks: tuple[int, ...]) -> dict:
    watch = HangWatch(timeout=10)
    for r in ranks:
        watch.beat(r, 100 + r, step, step - 1, "train", 0.0)
    return watch.ranks


def test_the_last_line_names_the_hung_rank_its_state_and_step(make_config, tmp_path: Path) -> None:
    config = load_config(make_config(trainer={"max_steps": 12},
                                     distributed_strategy={"tensor_model_parallel_size": 1, "heartbeat_timeout": 10}))
    stopped = Hang("silent", (1,), 11.2, 10, _beats(7, (0, 1)), {0: "S", 1: "T"})
    assert heartbeat_line(stopped, config, tmp_path) == (
        "nxd train: rank 1 stopped taking part first (hung: no heartbeat from its process for 11s, over "
        "distributed_strategy.heartbeat_timeout=10s; its process was stopped (SIGSTOP or job control), so it could "
        "not say where) at step 7 of 12; nxd train stopped the job")
    # alive but stuck: the stacks the teardown's SIGTERM left tell the rank that waited from the one it waited for
    (tmp_path / STATUS_DIR).mkdir()
    (tmp_path / STATUS_DIR / "rank_0.stack").write_text(
        'Stack (most recent call first):\n  File "/v/torch/distributed/distributed_c10d.py", line 9 in all_reduce\n'
        '  File "/v/nxd_core_parallel/grads.py", line 88 in allreduce\n')
    (tmp_path / STATUS_DIR / "rank_1.stack").write_text(
        'Stack (most recent call first):\n  File "/x/hooks/sitecustomize.py", line 4 in <lambda>\n'
        '  File "/x/src/nxd_training/loop.py", line 300 in train_step\n')
    stalled = Hang("stalled", (0, 1), 40.4, 40.0, _beats(7, (0, 1)), {0: "S", 1: "S"})
    assert heartbeat_line(stalled, config, tmp_path) == (
        "nxd train: rank 1 stopped taking part first (hung: alive, but no rank completed a step for 40s, over 40s "
        "(10 x the longest step, above distributed_strategy.heartbeat_timeout=10s)) at step 7 of 12; nxd train "
        "stopped the job; when stopped, rank 0 was in distributed/distributed_c10d.py:9 in all_reduce, called from "
        "nxd_core_parallel/grads.py:88 in allreduce; rank 1 was in hooks/sitecustomize.py:4 in <lambda>, called "
        "from nxd_training/loop.py:300 in train_step")
    seen = Hang("silent", (1,), 31.4, 10, _beats(7, (0, 1)), {1: "T"}, stopped_job=False)
    assert heartbeat_line(seen, config, tmp_path) == (
        "nxd train: rank 1 stopped taking part first (hung: no heartbeat from its process for 31s; its process was "
        "stopped (SIGSTOP or job control), so it could not say where) at step 7 of 12; when stopped, rank 1 was in "
        "hooks/sitecustomize.py:4 in <lambda>, called from nxd_training/loop.py:300 in train_step")
