"""Start the ranks of a run: in this process for one device, otherwise through torchrun.

The resolved config is written once to ``<log_dir>/config.yaml``; every rank deserialises that
file (``python -m nxd_training.worker``; a one-device run reads it back in this process too), so
all ranks train exactly what ``nxd train`` validated, in the same log dir.

One live writer per run directory (:func:`run_dir_lock`): a second ``nxd train`` into the same ``version_N`` would
interleave metrics and replace the other's checkpoints. The lock is an ``flock`` on
``<log_dir>/.nxd-run.lock``, so the kernel drops it when the holder dies (no stale locks).
"""

from __future__ import annotations

import fcntl
import os
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

from nxd.errors import ConfigError
from nxd_training import rank_status
from nxd_training.config.resolved import dump_resolved, load_resolved
from nxd_training.config.schema import LauncherConfig, TrainerConfig, TrainingConfig
from nxd_training.failure import first_failure, heartbeat_line, rendezvous_failure
from nxd_training.hang_watch import Hang, Watcher, kill_stopped
from nxd_training.parent_death import die_with_parent

LOCK_NAME = ".nxd-run.lock"
#: exit code of a job nxd train stopped because a rank hung (distributed_strategy.heartbeat_timeout)
HUNG = 1


@contextmanager
def run_dir_lock(log_dir: Path) -> Iterator[None]:
    """Hold the run directory's lock for the duration; refuse if another live process holds it."""
    log_dir.mkdir(parents=True, exist_ok=True)
    path = log_dir / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 256, 0).decode(errors="replace").strip() or "another process"
            raise ConfigError(
                f"{log_dir} is in use by a running nxd train ({holder}); wait for it to finish, or write "
                "elsewhere (exp_manager.explicit_log_dir / exp_manager.version)"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}".encode(), 0)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def torchrun_command(lc: LauncherConfig, tr: TrainerConfig, config_path: Path) -> list[str]:
    """The ``python -m torch.distributed.run`` command line for the run's ``launcher`` and ``trainer``
    sections (no fixed ports: single-node runs use a c10d rendezvous on a free port)."""
    cmd = [
        sys.executable, "-m", "torch.distributed.run",
        f"--nproc-per-node={lc.nproc_per_node or tr.devices}",
        f"--nnodes={tr.num_nodes}",
        f"--max-restarts={lc.max_restarts}",
        f"--monitor-interval={lc.monitor_interval}",
        f"--rdzv-backend={lc.rdzv_backend}",
        f"--rdzv-endpoint={lc.rdzv_endpoint or '127.0.0.1:0'}",
        # every node must present the same id: derive it from the shared endpoint when none is set
        f"--rdzv-id={lc.rdzv_id or (f'nxd-{lc.rdzv_endpoint}' if tr.num_nodes > 1 else uuid.uuid4().hex)}",
    ]
    if lc.node_rank is not None:
        cmd.append(f"--node-rank={lc.node_rank}")
    if tr.num_nodes > 1 and not any(a.startswith(("--rdzv-conf", "--rdzv_conf")) for a in lc.extra_args):
        # bounded: a node that never comes (or went away) ends every other node's wait (docs/cluster.md)
        cmd.append(f"--rdzv-conf=join_timeout={lc.rdzv_join_timeout},last_call_timeout={lc.rdzv_last_call_timeout},"
                   f"read_timeout={lc.rdzv_read_timeout}")
    cmd += list(lc.extra_args)
    cmd += ["--module", "nxd_training.worker", str(config_path)]
    return cmd


def write_run_config(config: TrainingConfig, log_dir: Path) -> Path:
    log_dir.mkdir(parents=True, exist_ok=True)
    pinned = config.model_copy(deep=True)
    pinned.exp_manager.explicit_log_dir = str(log_dir.resolve())
    path = log_dir / "config.yaml"
    tmp = path.with_suffix(".yaml.tmp")
    tmp.write_text(dump_resolved(pinned))
    os.replace(tmp, path)
    return path


def launch(config: TrainingConfig, log_dir: Path) -> int:
    """Run training; returns the exit code (torchrun's for multi-rank runs). The run directory is
    locked against a second live writer (on multi-node runs, by node 0 only: one shared directory).
    Ctrl-C ends it with one line (:mod:`nxd_training.interrupt`) and exit code 130."""
    from nxd_training.interrupt import INTERRUPTED, INTERRUPTED_LOG, STOPPED, stopped_message

    lock = run_dir_lock(log_dir) if not config.launcher.node_rank else nullcontext()
    with lock:
        print(f"nxd train: writing to {log_dir}", flush=True)  # not before: a refused run writes nothing
        config_path = write_run_config(config, log_dir)
        rank_status.clear(log_dir)  # what the ranks of this launch leave is what its last line reads
        if config.trainer.devices * config.trainer.num_nodes == 1:
            from nxd_training.loop import train

            try:
                train(load_resolved(config_path), log_dir=log_dir)  # what a rank reads, not the object in hand
            except KeyboardInterrupt:
                code = INTERRUPTED
            else:
                return 0
        else:
            env = dict(os.environ)
            env.setdefault("OMP_NUM_THREADS", "1")
            env["PYTHONUNBUFFERED"] = "1"
            if config.launcher.node_rank is not None:  # the ranks' records name the node as the user knows it
                env[rank_status.NODE_ENV] = str(config.launcher.node_rank)
            timeout = config.distributed_strategy.heartbeat_timeout
            watcher = Watcher(timeout) if timeout else None  # this node's ranks' heartbeats (docs/cluster.md)
            if watcher is not None:
                env.update(watcher.env())
            code, stderr_tail = run_forwarding_signals(torchrun_command(config.launcher, config.trainer, config_path), env,
                                                       log_dir / INTERRUPTED_LOG, with_tail=True, watcher=watcher)
            hang = watcher.hang if watcher is not None else None
            if hang is not None and code not in STOPPED:  # nxd train stopped the job: its verdict is the cause
                code = HUNG
            elif watcher is not None and code not in (0, *STOPPED):
                # a rank seen stopped before another bound ended the job: the cause, not the SIGKILL that reaped it
                hang = watcher.seen_stopped()
            if hang is not None and code not in STOPPED:
                print(heartbeat_line(hang, config, log_dir), file=sys.stderr, flush=True)
            elif code not in (0, *STOPPED):
                # a rank that ran and failed explains a rendezvous lost after it (its node's launcher went
                # away with it); the rendezvous line is for runs where no rank of this node reported
                line = first_failure(config, log_dir, stderr_tail) or rendezvous_failure(config.launcher, config.trainer.num_nodes, stderr_tail)
                if line:
                    print(line, file=sys.stderr, flush=True)
    if code in STOPPED:  # stopped by the user or the scheduler: no rank failed, nothing to blame
        by = "" if code == INTERRUPTED else signal.Signals(code - 128).name
        print(stopped_message(config.exp_manager, log_dir, by), file=sys.stderr, flush=True)
    return code


def restart_note(config: TrainingConfig, log_dir: Path) -> str | None:
    """A run starting over where complete checkpoints exist (a run's config.yaml run again without
    ``exp_manager.resume_if_exists``) says so, with the command that continues instead."""
    from nxd_training.interrupt import last_checkpoint, resume_command

    em = config.exp_manager
    if em.resume_if_exists or em.resume_from_checkpoint or config.launcher.node_rank:
        return None
    last = last_checkpoint(em, log_dir)
    if last is None:
        return None
    tag, step = last
    return (f"nxd train: not resuming: exp_manager.resume_if_exists is false, so this run starts at step 0 although "
            f"{tag} (step {step}) is complete here; to continue from it instead: {resume_command(em, log_dir)}")


def run_forwarding_signals(cmd: list[str], env: dict[str, str], interrupted_log: Path,
                           with_tail: bool = False, watcher: Watcher | None = None) -> int | tuple[int, str]:
    """Run torchrun and pass SIGTERM/SIGINT/SIGHUP on to it, so stopping ``nxd train`` stops the
    agent and, through it, every rank (a plain wait would leave them training as orphans).

    torchrun runs in its own session, so a terminal's Ctrl-C reaches it once, through us. After any
    of these signals the job's stderr (its ranks' and torchrun's own tracebacks: torchrun raises a
    SignalException) goes to ``interrupted_log`` and the exit code is 128 + the signal (130,
    INTERRUPTED, for SIGINT; 143 SIGTERM; 129 SIGHUP). ``with_tail``: also the end of its stderr.

    ``watcher``: when it finds a hung rank, torchrun is stopped the same way (its SIGTERM makes every
    rank that can run write its stack), a stopped rank is killed (it cannot run that SIGTERM), and the
    teardown's stderr goes to ``interrupted_log`` too."""
    from nxd_training.interrupt import StderrRelay

    # SIGTERM when nxd train dies, even by SIGKILL: the agent then stops its ranks, which also die with it
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, start_new_session=True,
                            preexec_fn=lambda: die_with_parent(signal.SIGTERM))
    relay = StderrRelay(proc.stderr, interrupted_log)
    interrupted = []

    def forward(signum: int, _frame: object) -> None:
        relay.mute()
        interrupted.append(signum)
        proc.send_signal(signum)

    def tear_down(hang: Hang) -> None:
        relay.mute()
        proc.send_signal(signal.SIGTERM)
        kill_stopped(hang)

    forwarded = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    previous = {sig: signal.signal(sig, forward) for sig in forwarded}
    if watcher is not None:
        watcher.start(tear_down)
    try:
        code = proc.wait()
    finally:
        if watcher is not None:
            watcher.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    relay.join()
    code = 128 + interrupted[0] if interrupted else code
    return (code, relay.tail()) if with_tail else code
