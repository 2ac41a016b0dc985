"""A collective that timed out, told as a user needs it: which collective, over which ranks, called
from where (on the rank that waited), and where the rank that never came was when it was stopped
(its stack, dumped by the kernel-level SIGTERM handler torchrun's stop triggers)."""

from __future__ import annotations

import faulthandler
import re
import signal
from pathlib import Path
from types import TracebackType
from typing import IO, Any

#: how the backends word a timed-out collective: gloo raises on the waiting rank; NCCL's watchdog
#: reports (and, with TORCH_NCCL_ASYNC_ERROR_HANDLING, tears the process down) on its own thread
TIMEOUT_PATTERN = re.compile(r"Timed out waiting \d+ms for (recv|send) operation|collective operation timeout")

#: the attribute a timed-out exception carries its :func:`locate_collective` record in
COLLECTIVE_ATTR = "nxd_collective"


def _frames(tb: TracebackType | None) -> list[tuple[Any, int]]:
    out = []
    while tb is not None:
        out.append((tb.tb_frame, tb.tb_lineno))
        tb = tb.tb_next
    return out


def _short(path: str) -> str:
    """``.../site-packages/nxd_core_parallel/grads.py`` -> ``nxd_core_parallel/grads.py``."""
    parts = Path(path).parts
    return "/".join(parts[-2:])


def _in_torch(path: str) -> bool:
    return "torch" in Path(path).parts[:-1]


def _ours(path: str) -> bool:
    """A file of nxd's packages (``nxd``, ``nxd_training``, ``nxd_core_parallel``, ...)."""
    return Path(path).parent.name.startswith("nxd")


def locate_collective(exc: BaseException) -> dict[str, Any] | None:
    """For a backend's collective timeout: the torch.distributed call (``op``), the global ranks of its
    group (``ranks``; None when unknown) and the innermost caller outside torch (``caller``). Call it
    while the process group still exists (before the trainer destroys it); None for other errors."""
    if not isinstance(exc, RuntimeError) or not TIMEOUT_PATTERN.search(str(exc)):
        return None
    import torch.distributed as dist

    op, ranks, caller = None, None, None
    for frame, line in _frames(exc.__traceback__):
        code = frame.f_code
        if code.co_filename.endswith("distributed_c10d.py") and not code.co_name.startswith("_") \
                and code.co_name != "wrapper":  # c10d's logging decorators wrap every public call
            op = code.co_name
            group = frame.f_locals.get("group") or frame.f_locals.get("pg")
            try:
                ranks = sorted(dist.get_process_group_ranks(group or dist.group.WORLD))
            except (RuntimeError, ValueError, AttributeError, KeyError):
                ranks = None
        elif not _in_torch(code.co_filename):
            caller = f"{_short(code.co_filename)}:{line} in {code.co_name}"
    return {"op": op, "ranks": ranks, "caller": caller}


def describe(site: dict[str, Any] | None) -> str:
    """``all_reduce over ranks [0, 1] (called from nxd_core_parallel/grads.py:88 in allreduce)``."""
    if not site:
        return "a collective"
    what = site.get("op") or "a collective (waiting on its handle)"
    if site.get("ranks") is not None:
        what += f" over ranks {site['ranks']}"
    if site.get("caller"):
        what += f" (called from {site['caller']})"
    return what


class CollectiveTimeout(RuntimeError):
    """A collective on this rank waited longer than ``distributed_strategy.collective_timeout``;
    ``site`` is its :func:`locate_collective` record."""

    def __init__(self, message: str, site: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.site = site


def explain_collective_timeout(exc: BaseException, seconds: float) -> CollectiveTimeout | None:
    """A :class:`CollectiveTimeout` naming this rank, the collective and the configured timeout
    (``seconds``) when ``exc`` is a backend's collective timeout, else None."""
    if not isinstance(exc, RuntimeError) or not TIMEOUT_PATTERN.search(str(exc)):
        return None
    from nxd_training.rank_status import identity

    me = identity()
    site = getattr(exc, COLLECTIVE_ATTR, None)
    where = f"rank {me['rank']} (node {me['node']}, local rank {me['local_rank']})"
    return CollectiveTimeout(
        f"{where}: {describe(site)} did not complete within distributed_strategy.collective_timeout={seconds:g}s: "
        "another rank stopped taking part (hung, stopped or dead; a hung rank reports no error of its own). "
        "If a step may legitimately wait longer (a slow checkpoint save, a long first compile), raise "
        f"distributed_strategy.collective_timeout. Backend: {str(exc).strip()}", site)


def stack_file(run_dir: Path, rank: int) -> Path:
    from nxd_training.rank_status import STATUS_DIR

    return run_dir / STATUS_DIR / f"rank_{rank}.stack"


def dump_stack_on_sigterm(run_dir: Path, rank: int) -> IO[str] | None:
    """When torchrun stops this rank (SIGTERM), write its Python stack to ``.ranks/rank_N.stack``
    first, then die of SIGTERM as before. faulthandler writes from the signal handler itself, so a
    rank stuck in C (a collective, a lock) leaves its stack too. Returns the open file (keep it)."""
    try:
        path = stack_file(run_dir, rank)
        path.parent.mkdir(exist_ok=True)
        out = path.open("w")
        faulthandler.register(signal.SIGTERM, file=out, all_threads=False, chain=True)
        return out
    except (OSError, AttributeError, ValueError, RuntimeError):  # no SIGTERM handler on this platform
        return None


def stopped_at(run_dir: Path, rank: int) -> str | None:
    """Where ``rank`` was when it was stopped, by its stack dump: the innermost frame, and the
    innermost one in nxd's code when that is another; None without a dump."""
    try:
        text = stack_file(run_dir, rank).read_text()
    except OSError:
        return None
    frames = re.findall(r'File "([^"]+)", line (\d+) in (\S+)', text)
    if not frames:
        return None
    where = [f"{_short(path)}:{line} in {name}" for path, line, name in frames]
    ours = next((w for w, (path, _, _) in zip(where, frames) if _ours(path)), None)
    return where[0] + (f", called from {ours}" if ours and ours != where[0] else "")


def waiting_in_collective(run_dir: Path, rank: int) -> bool:
    """Whether ``rank``'s stack dump shows it waiting in torch.distributed (innermost frame)."""
    try:
        text = stack_file(run_dir, rank).read_text()
    except OSError:
        return False
    frames = re.findall(r'File "([^"]+)", line \d+ in \S+', text)
    return bool(frames) and "distributed" in Path(frames[0]).parts and _in_torch(frames[0])
