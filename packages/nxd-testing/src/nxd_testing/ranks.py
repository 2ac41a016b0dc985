"""A pool of real ``torch.distributed`` ranks (gloo on CPU) that tests reuse.

Spawning a rank costs a torch import (seconds), so a pool starts ``world_size`` worker processes
once and runs many test bodies on them. A body is a module-level function; it runs on every rank
with the default process group initialised, and its per-rank return values come back as a list.

A body that raises on any rank fails the call with every rank's traceback; a rank that does not
answer within ``timeout`` fails it too. In both cases the pool is torn down (a failed collective
can poison the group) and the next call starts fresh ranks, so one failure never hangs or taints
later tests.
"""

from __future__ import annotations

import importlib.util
import multiprocessing as mp
import os
import queue
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

DEFAULT_TIMEOUT = float(os.environ.get("NXD_TEST_TIMEOUT", "180"))


class RankError(AssertionError):
    """A body failed or timed out on one or more ranks; the message holds each rank's traceback."""


@dataclass(frozen=True)
class _Task:
    task_id: int
    file: str
    qualname: str
    args: tuple
    kwargs: dict


def _load_function(file: str, qualname: str) -> Callable[..., Any]:
    module_name = "_nxd_rank_task_" + str(abs(hash(file)))
    module = sys.modules.get(module_name)
    if module is None:
        spec = importlib.util.spec_from_file_location(module_name, file)
        assert spec is not None and spec.loader is not None, file
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    obj: Any = module
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _reset_parallel_state() -> None:
    # Bodies may leave model-parallel groups behind; drop them so the next body starts clean.
    from nxd.parallel import destroy_parallel_context

    destroy_parallel_context()


def _worker(rank: int, world_size: int, port: int, tasks: Any, results: Any, timeout: float, env: dict) -> None:
    os.environ.update(env)
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank),
                       "LOCAL_WORLD_SIZE": str(world_size), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, world_size, is_master=False, timeout=timedelta(seconds=timeout))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout))
    while True:
        task = tasks.get()
        if task is None:
            break
        try:
            fn = _load_function(task.file, task.qualname)
            outcome = (True, fn(*task.args, **task.kwargs))
        except BaseException:  # noqa: BLE001 - every failure goes back to the test
            outcome = (False, traceback.format_exc())
        try:
            # Before answering: the parent sends the next body only when every rank has answered,
            # so no rank starts creating new groups while another still tears down the old ones.
            _reset_parallel_state()
        except Exception:  # noqa: BLE001 - a broken group is detected by the next task
            pass
        results.put((task.task_id, rank, *outcome))
    dist.destroy_process_group()


class RankPool:
    """``world_size`` worker processes with a gloo process group, reused across calls."""

    def __init__(self, world_size: int, timeout: float = DEFAULT_TIMEOUT, env: dict[str, str] | None = None) -> None:
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        self.world_size = world_size
        self.timeout = timeout
        self.env = {"OMP_NUM_THREADS": "1", **(env or {})}
        self._procs: list[Any] = []
        self._task_queues: list[Any] = []
        self._results: Any = None
        self._store: Any = None
        self._next_id = 0

    # ------------------------------------------------------------------ lifecycle
    @property
    def started(self) -> bool:
        return bool(self._procs)

    def start(self) -> None:
        """Start the ranks now (``run`` starts them on first use): they inherit this process's
        environment as it is at this moment, for their whole life."""
        if not self._procs:
            self._start()

    def _start(self) -> None:
        import torch.distributed as dist

        ctx = mp.get_context("spawn")
        # The parent hosts the rendezvous store on a free port (port 0), so no fixed port is used.
        self._store = dist.TCPStore("127.0.0.1", 0, self.world_size, is_master=True, wait_for_workers=False,
                                    timeout=timedelta(seconds=self.timeout))
        self._results = ctx.Queue()
        self._task_queues = [ctx.Queue() for _ in range(self.world_size)]
        self._procs = [
            ctx.Process(target=_worker, args=(r, self.world_size, self._store.port, self._task_queues[r],
                                              self._results, self.timeout, self.env), daemon=True)
            for r in range(self.world_size)
        ]
        for proc in self._procs:
            proc.start()

    def close(self) -> None:
        """Stop the workers (politely, then by force)."""
        for q in self._task_queues:
            try:
                q.put(None)
            except Exception:  # noqa: BLE001
                pass
        deadline = time.monotonic() + 5
        started = [proc for proc in self._procs if proc.pid is not None]  # a failed start leaves some unstarted
        for proc in started:
            proc.join(max(0.0, deadline - time.monotonic()))
        for proc in started:
            if proc.is_alive():
                proc.kill()
                proc.join()
        self._procs, self._task_queues, self._results, self._store = [], [], None, None

    def __enter__(self) -> RankPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ running bodies
    def run(self, fn: Callable[..., Any], *args: Any, timeout: float | None = None, **kwargs: Any) -> list[Any]:
        """Run module-level ``fn(*args, **kwargs)`` on every rank; return the values by rank."""
        if getattr(fn, "__module__", None) is None or "<locals>" in fn.__qualname__:
            raise ValueError(f"{fn!r} must be a module-level function so the ranks can import it")
        file = str(Path(sys.modules[fn.__module__].__file__ or "").resolve())
        if not self._procs:
            self._start()
        self._next_id += 1
        task = _Task(self._next_id, file, fn.__qualname__, args, kwargs)
        for q in self._task_queues:
            q.put(task)
        return self._collect(task, timeout or self.timeout)

    def _collect(self, task: _Task, timeout: float) -> list[Any]:
        values: dict[int, Any] = {}
        failures: dict[int, str] = {}
        deadline = time.monotonic() + timeout
        while len(values) + len(failures) < self.world_size:
            remaining = deadline - time.monotonic()
            if failures:  # the others may be stuck in a collective with the failed rank
                remaining = min(remaining, 10.0)
            dead = [r for r, p in enumerate(self._procs) if not p.is_alive() and r not in values and r not in failures]
            for r in dead:
                failures[r] = f"rank {r} process died (exit code {self._procs[r].exitcode})"
            if dead:
                continue
            try:
                task_id, rank, ok, value = self._results.get(timeout=max(0.05, min(remaining, 1.0)))
            except queue.Empty:
                if time.monotonic() >= deadline or (failures and remaining <= 0.05):
                    break
                continue
            if task_id != task.task_id:
                continue
            (values if ok else failures)[rank] = value
        if failures or len(values) < self.world_size:
            missing = [r for r in range(self.world_size) if r not in values and r not in failures]
            self.close()
            parts = [f"--- rank {r} ---\n{tb}" for r, tb in sorted(failures.items())]
            if missing:
                parts.append(f"--- ranks {missing} did not finish within {timeout:.0f}s (hung in a collective?) ---")
            raise RankError(f"{task.qualname} failed on {self.world_size} ranks:\n" + "\n".join(parts))
        return [values[r] for r in range(self.world_size)]


def run_on_ranks(world_size: int, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> list[Any]:
    """One-off: start ``world_size`` ranks, run ``fn`` on each, stop them (scripts, benchmarks)."""
    with RankPool(world_size) as pool:
        return pool.run(fn, *args, **kwargs)
