"""``nxd train``'s side of the heartbeat (:mod:`nxd_training.heartbeat`): which rank of this node
stopped, decided from the beats alone, within ``distributed_strategy.heartbeat_timeout`` instead of
the collective timeout's 30 minutes.

- **silent**: a rank whose process sent no beat for ``heartbeat_timeout`` while it still exists: it
  cannot run at all (stopped by SIGSTOP or a debugger, a frozen host), so it cannot say where it is.
- **stalled**: every rank beats but none completed a training step for
  ``max(heartbeat_timeout, STEP_FACTOR x the longest step seen)``; armed once a rank completed a
  step of this launch (start-up, resume and the first compile are not steps), and paused while a
  rank saves a checkpoint or validates (those are bounded by the collective timeout).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Literal

#: a stall bound is never under this many times the longest step the ranks took (slow steps are no hang)
STEP_FACTOR = 10.0
#: the phase of a rank in its training steps (nxd_training.rank_status.progress["phase"])
TRAINING = "train"
#: a rank quiet this long (at least) whose process is stopped or in uninterruptible sleep is seen as
#: stopped, should the job end another way first (a shorter collective timeout): the cause, not its SIGKILL
SEEN_STOPPED_S = 5.0
STOPPED_STATES = ("T", "t", "D")


@dataclass
class RankBeats:
    """What the launcher knows of one rank: its process, progress and when it last changed."""

    pid: int
    step: int | None
    done: int | None
    phase: str | None
    last_beat: float
    last_change: float
    first_done: int | None  # the step this launch started from (a resumed run's checkpoint step)
    longest_step: float = 0.0

    @property
    def armed(self) -> bool:
        """A step of this launch completed: the stall bound applies from now."""
        return self.done is not None and self.first_done is not None and self.done > self.first_done


@dataclass(frozen=True)
class Hang:
    """A verdict: ``kind`` (silent or stalled), the ranks, how long and the bound that was passed,
    each rank's beats when it was decided and its process' state then (:func:`process_state`).
    ``stopped_job``: nxd train stopped the job on it (else it was seen before the job ended otherwise)."""

    kind: Literal["silent", "stalled"]
    ranks: tuple[int, ...]
    seconds: float
    bound: float
    beats: dict[int, RankBeats] = field(default_factory=dict)
    states: dict[int, str | None] = field(default_factory=dict)
    stopped_job: bool = True


class HangWatch:
    """The decision, from beats and a clock (``now``: seconds, monotonic)."""

    def __init__(self, timeout: float, factor: float = STEP_FACTOR) -> None:
        self.timeout, self.factor = timeout, factor
        self.ranks: dict[int, RankBeats] = {}

    def beat(self, rank: int, pid: int, step: int | None, done: int | None, phase: str | None, now: float) -> None:
        known = self.ranks.get(rank)
        if known is None or known.pid != pid:  # a first beat, or a restarted rank (launcher.max_restarts)
            self.ranks[rank] = RankBeats(pid, step, done, phase, now, now, done)
            return
        if (done, phase) != (known.done, known.phase):
            if phase == known.phase == TRAINING and known.armed:  # a whole step between two completions
                known.longest_step = max(known.longest_step, now - known.last_change)
            if known.first_done is None:
                known.first_done = known.done if known.done is not None else done
            known.done, known.phase, known.last_change = done, phase, now
        known.step, known.last_beat = step, now

    def pause(self, seconds: float) -> None:
        """The watcher was not listening for ``seconds``: that time counts as no rank's silence or stall."""
        for beats in self.ranks.values():
            beats.last_beat += seconds
            beats.last_change += seconds

    def stall_bound(self) -> float:
        """``max(timeout, factor x the longest step of any rank)``."""
        longest = max((r.longest_step for r in self.ranks.values()), default=0.0)
        return max(self.timeout, self.factor * longest)

    def check(self, now: float, alive: Callable[[int], bool] = lambda pid: True) -> Hang | None:
        """The verdict at ``now``, or None. ``alive(pid)``: the process exists and is no zombie (a
        rank that died is torchrun's to report, not a hang)."""
        silent = sorted(r for r, b in self.ranks.items() if now - b.last_beat > self.timeout and alive(b.pid))
        if silent:
            quiet = min(now - self.ranks[r].last_beat for r in silent)
            return Hang("silent", tuple(silent), quiet, self.timeout, self._snapshot())
        bound = self.stall_bound()
        beats = self.ranks.values()
        if beats and all(b.armed and b.phase == TRAINING and now - b.last_change > bound for b in beats):
            still = min(now - b.last_change for b in beats)
            return Hang("stalled", tuple(sorted(self.ranks)), still, bound, self._snapshot())
        return None

    def _snapshot(self) -> dict[int, RankBeats]:
        return {r: RankBeats(**vars(b)) for r, b in self.ranks.items()}


def process_state(pid: int) -> str | None:
    """The kernel's one-letter state of ``pid`` (``R``, ``S``, ``D``, ``T`` stopped, ``t`` traced,
    ``Z``), None when it is gone or unknown (no /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _alive(pid: int) -> bool:
    state = process_state(pid)
    if state is not None:
        return state not in ("Z", "X")
    if os.path.exists("/proc/self"):  # /proc works and has no such process: it is gone
        return False
    try:  # no /proc: ask the kernel whether it exists
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


class Watcher:
    """Listens on ``127.0.0.1:<free port>`` for this node's ranks' beats and, once started, calls
    ``on_hang(hang)`` once, from its thread, when :class:`HangWatch` decides (then :attr:`hang` holds
    the verdict). ``env()``: what the ranks need to beat."""

    def __init__(self, timeout: float) -> None:
        self.watch = HangWatch(timeout)
        self.interval = min(1.0, timeout / 10)
        self.token = secrets.token_hex(8)
        self.hang: Hang | None = None
        self._on_hang: Callable[[Hang], None] = lambda hang: None
        self._stop = threading.Event()
        self._seen: dict[int, tuple[str, float, RankBeats]] = {}  # rank -> (state, quiet s, beats) seen stopped
        self._last_look = 0.0
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.settimeout(self.interval)
        self._thread = threading.Thread(target=self._run, name="nxd-hang-watch", daemon=True)

    def env(self) -> dict[str, str]:
        from nxd_training import heartbeat

        host, port = self._sock.getsockname()
        return {heartbeat.ADDR_ENV: f"{host}:{port}", heartbeat.TOKEN_ENV: self.token,
                heartbeat.INTERVAL_ENV: f"{self.interval:g}"}

    def start(self, on_hang: Callable[[Hang], None]) -> Watcher:
        self._on_hang = on_hang
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sock.close()

    def _run(self) -> None:
        last = time.monotonic()
        while not self._stop.is_set():
            try:
                data = [self._sock.recv(4096)]
            except TimeoutError:
                data = []
            except OSError:
                return
            now = time.monotonic()
            if now - last > 3 * self.interval + 1:  # this thread did not run (starved, or nxd train was stopped):
                self.watch.pause(now - last - self.interval)  # a gap in our listening is no rank's silence
            last = now
            data += self._drain()  # judge on every beat that arrived, not the first of a backlog
            for datagram in data:
                self._receive(datagram)
            if now - self._last_look >= self.interval:
                self._last_look = now
                self._look_for_stopped(now)
            hang = self.watch.check(now, _alive)
            if hang is not None and not self._stop.is_set():
                self.hang = replace(hang, states={r: process_state(b.pid) for r, b in hang.beats.items()})
                self._on_hang(self.hang)
                return

    def _drain(self) -> list[bytes]:
        out = []
        self._sock.setblocking(False)
        try:
            while True:
                out.append(self._sock.recv(4096))
        except (BlockingIOError, OSError):
            pass
        finally:
            self._sock.settimeout(self.interval)
        return out

    def _look_for_stopped(self, now: float) -> None:
        for rank, beats in self.watch.ranks.items():
            quiet = now - beats.last_beat
            if quiet >= max(SEEN_STOPPED_S, 3 * self.interval):
                state = process_state(beats.pid)
                if state in STOPPED_STATES:
                    self._seen[rank] = (state, quiet, RankBeats(**vars(beats)))
        if self._seen and any(not _alive(b.pid) for b in self.watch.ranks.values()):
            # the job is ending (another rank exited): a stopped rank cannot run torchrun's SIGTERM, and
            # torchrun would wait 30 s before its SIGKILL; the watch names it all the same (seen_stopped)
            kill_stopped(Hang("silent", tuple(self._seen), 0.0, self.watch.timeout,
                              {r: seen[2] for r, seen in self._seen.items()}))

    def seen_stopped(self) -> Hang | None:
        """The ranks seen stopped (no beats, state T/t/D) while the job ran, when it ended before the
        heartbeat timeout: a silent :class:`Hang` that did not stop the job; None when none was."""
        if not self._seen:
            return None
        ranks = sorted(self._seen)
        return Hang("silent", tuple(ranks), min(self._seen[r][1] for r in ranks), self.watch.timeout,
                    {r: self._seen[r][2] for r in ranks}, {r: self._seen[r][0] for r in ranks}, stopped_job=False)

    def _receive(self, data: bytes) -> None:
        try:
            beat = json.loads(data)
            if beat.get("token") != self.token:
                return
            rank = int(beat["rank"])
            self.watch.beat(rank, int(beat["pid"]), beat.get("step"), beat.get("done"), beat.get("phase"),
                            time.monotonic())
            self._seen.pop(rank, None)  # it runs again (SIGCONT): not stopped
        except (ValueError, KeyError, TypeError, AttributeError):
            return  # not a beat of ours


def kill_stopped(hang: Hang) -> list[int]:
    """SIGKILL the ranks of a silent hang whose process is stopped (``T``/``t``): it cannot run
    torchrun's SIGTERM until resumed, so the teardown would wait torchrun's 30 s grace for nothing.
    Returns the ranks killed."""
    killed = []
    for rank in hang.ranks if hang.kind == "silent" else ():
        pid = hang.beats[rank].pid
        if process_state(pid) in ("T", "t"):
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(rank)
            except OSError:
                pass
    return killed
