"""The one line ``nxd train`` ends a failed multi-rank run with, read from what torchrun printed."""

from __future__ import annotations

import re
import signal
from datetime import datetime
from pathlib import Path

from nxd_training.config.schema import LauncherConfig, TrainingConfig
from nxd_training.hang_watch import STEP_FACTOR, Hang

# torchrun's rendezvous errors carry no message of their own: the exception's name is the signal
_TIMEOUT, _LOST = "RendezvousTimeoutError", ("RendezvousConnectionError", "RendezvousClosedError")


def rendezvous_failure(lc: LauncherConfig, nodes: int, stderr_tail: str) -> str | None:
    """On a multi-node run (``nodes``: trainer.num_nodes) whose torchrun gave up in the rendezvous:
    which node this is, how long it waited, and the node(s) that never joined or went away; None
    for any other failure."""
    if nodes < 2:
        return None
    me = lc.node_rank
    others = [n for n in range(nodes) if n != me]
    missing = f"node {others[0]}" if len(others) == 1 else "one of nodes " + ", ".join(map(str, others))
    where = f"node {me} of {nodes}" if me is not None else f"this node (of {nodes})"
    if _TIMEOUT in stderr_tail:
        return (f"nxd train: {where}: the rendezvous at {lc.rdzv_endpoint} did not complete within "
                f"launcher.rdzv_join_timeout={lc.rdzv_join_timeout}s: {missing} never joined or went away "
                "before it completed (see that node's output; docs/cluster.md)")
    if any(name in stderr_tail for name in _LOST):
        return (f"nxd train: {where}: lost the rendezvous at {lc.rdzv_endpoint} (no answer within "
                f"launcher.rdzv_read_timeout={lc.rdzv_read_timeout}s): {missing}, hosting it, went away "
                "(see that node's output; docs/cluster.md)")
    return None


# torchrun's summary of each failed rank (torch.distributed.elastic's _FAILURE_FORMAT_TEMPLATE)
_FAILURE = re.compile(r"time\s*:\s*(?P<time>\S+)\s*\n\s*host\s*:\s*(?P<host>\S+)\s*\n\s*rank\s*:\s*(?P<rank>\d+) "
                      r"\(local_rank: (?P<local>\d+)\)\s*\n\s*exitcode\s*:\s*(?P<code>-?\d+)")
# what a rank reports when another rank went away first: never the cause
_CONSEQUENCE = re.compile(r"Connection (reset|closed) by peer|Connection refused|Broken pipe|ECONNRESET|"
                          r"recvBytes|Socket Timeout|NCCL communicator was aborted|ProcessGroup.*aborted", re.I)


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def first_failure(config: TrainingConfig, log_dir: Path, stderr_tail: str) -> str | None:
    """One line naming the rank that failed first (how, at which step; node and rank on multi-node
    runs), from the ranks' own records (``rank_status``) and torchrun's failure summary. Causes
    (a signal other than torchrun's SIGTERM, an exception that is not a lost connection, an exit
    code, an early clean exit) come before consequences; among causes, the earliest."""
    from nxd_training import rank_status

    records = rank_status.read_all(log_dir)
    reported = {}
    for m in _FAILURE.finditer(stderr_tail):
        try:
            when = datetime.fromisoformat(m["time"]).timestamp()
        except ValueError:
            when = float("inf")
        reported[int(m["rank"])] = (int(m["code"]), when, int(m["local"]))
    world = config.trainer.devices * config.trainer.num_nodes
    per_node = config.launcher.nproc_per_node or config.trainer.devices
    multi, me = config.trainer.num_nodes > 1, config.launcher.node_rank
    # this node's rendezvous group: that of the ranks its torchrun reported, or that left its node's records
    mine = {r // per_node for r in reported} | {
        rec.get("group") for rec in records.values() if multi and me is not None and rec.get("node") == me}
    causes, consequences, elsewhere, waited = [], [], [], {}
    for rank in range(world):
        record, failed = records.get(rank), reported.get(rank)
        how = None
        if record is not None and record.get("collective") is not None:  # it waited for another rank
            waited[rank] = record
            consequences.append((record["time"], rank, f"raised {record['what']}", record))
            continue
        if record is not None and record["how"] == "exception":
            how = f"raised {record['what']}"
            (consequences if _CONSEQUENCE.search(record["what"]) else causes).append((record["time"], rank, how, record))
            continue
        if failed is not None and failed[0] < 0:
            how = f"was killed by {_signal_name(failed[0])} (exit code {failed[0]})"
            bucket = consequences if failed[0] == -signal.SIGTERM else causes
            bucket.append((failed[1], rank, how, record))
        elif failed is not None:
            causes.append((failed[1], rank, f"exited with code {failed[0]}", record))
        elif record is not None and record["how"] == "exit":
            causes.append((record["time"], rank, f"exited with code {record['code']}", record))
        elif record is None and multi and rank // per_node not in mine:
            elsewhere.append(rank)  # another node's rank that left nothing here: its node's output tells
        elif record is None:  # neither finished nor failed: it left with code 0 (os._exit, or killed quietly)
            causes.append((float("inf"), rank, "exited with code 0", None))
    if not causes and not consequences:
        return None
    if not causes and waited:
        return hang_line(config.distributed_strategy.collective_timeout, world, log_dir, waited)
    if not causes and elsewhere:
        _, rank, how, record = min(consequences)
        others = ("rank " if len(elsewhere) == 1 else "ranks ") + ", ".join(map(str, elsewhere))
        return (f"nxd train: node {_node(record, me, rank, per_node)} of {config.trainer.num_nodes}: the rank that "
                f"failed first is on another node ({others} left nothing here); this node's rank {rank} only "
                f"lost its peers (it {how}): see the other node's output")
    when, rank, how, record = min(causes or consequences)
    total = (record or {}).get("max_steps") or (config.trainer.max_steps if config.trainer.max_steps > 0 else None)
    if record is not None and not record.get("step"):  # its own record: no step of this launch began
        at = " before its first step (starting up or resuming)"
    else:  # no record (a signal): the step rank 0 logged last, + 1
        step = (record or {}).get("step") or _logged_step(config.exp_manager.metrics_file, log_dir)
        at = f" at step {step}" + (f" of {total}" if total else "") if step else ""
    if how == "exited with code 0":
        at += " without finishing"
    where = f"rank {rank} (node {_node(record, me, rank, per_node)}, local rank {rank % per_node})" if multi \
        else f"rank {rank}"
    return f"nxd train: {where} failed first: it {how}{at}"


def hang_line(seconds: float, world: int, log_dir: Path, waited: dict[int, dict]) -> str:
    """No rank failed, some timed out in a collective (``seconds``: distributed_strategy.collective_timeout,
    ``world`` ranks writing to ``log_dir``): name the rank(s) of those collectives that never came (with where each was
    when stopped), or, when every rank of them waited, the different collectives they waited in
    (the ranks disagree on the order of collectives)."""
    from nxd_training.hang import describe, stopped_at

    ranks = range(world)  # a group of unknown ranks: any rank
    members = sorted({r for rec in waited.values() for r in (rec["collective"].get("ranks") or ranks)})
    hung = [r for r in members if r not in waited]
    first = min(waited, key=lambda r: waited[r]["time"])
    record = waited[first]
    step, total = record.get("step"), record.get("max_steps")
    at = f" at step {step}" + (f" of {total}" if total else "") if step else ""
    if hung:
        who = ("rank " if len(hung) == 1 else "ranks ") + ", ".join(map(str, hung))
        where = "; ".join(f"rank {r} was in {s}" for r in hung if (s := stopped_at(log_dir, r)))
        return (f"nxd train: {who} stopped taking part first (hung: {'it' if len(hung) == 1 else 'they'} reported "
                f"no error): rank {first} waited distributed_strategy.collective_timeout={seconds:g}s for "
                f"{'it' if len(hung) == 1 else 'them'} in {describe(record['collective'])}{at}"
                + (f"; when stopped, {where}" if where else ""))
    each = "; ".join(f"rank {r} in {describe(rec['collective'])}" for r, rec in sorted(waited.items()))
    return (f"nxd train: ranks {', '.join(map(str, sorted(waited)))} each waited distributed_strategy."
            f"collective_timeout={seconds:g}s{at}, in different collectives: {each} (the ranks called collectives "
            "in different orders; no rank failed)")


#: what a rank's process state (hang_watch.process_state) says about a rank that sent no heartbeat
_STATES = {"T": "its process was stopped (SIGSTOP or job control), so it could not say where",
           "t": "its process was stopped by a debugger or tracer",
           "D": "its process was in uninterruptible I/O (state D)"}


def heartbeat_line(hang: Hang, config: TrainingConfig, log_dir: Path) -> str:
    """The line for a job ``nxd train`` stopped on its heartbeat verdict (:mod:`nxd_training.hang_watch`),
    or that ended otherwise after a rank was seen stopped (``hang.stopped_job`` false):
    the rank(s), how they hung (no heartbeat, with the process state; or alive without completing a
    step, with the bound), the step, and where each was when stopped (its stack, when it could run)."""
    from nxd_training.hang import stopped_at, waiting_in_collective

    key = f"distributed_strategy.heartbeat_timeout={config.distributed_strategy.heartbeat_timeout:g}s"
    ranks = list(hang.ranks)
    if hang.kind == "silent":
        states = [_STATES[s] for r in ranks if (s := hang.states.get(r)) in _STATES]
        over = f", over {key}" if hang.stopped_job else ""
        how = f"hung: no heartbeat from its process for {hang.seconds:.0f}s{over}" + (
            f"; {states[0]}" if len(set(states)) == 1 and len(states) == len(ranks) else "")
    else:
        waiting = [r for r in ranks if waiting_in_collective(log_dir, r)]
        if 0 < len(waiting) < len(ranks):  # the others wait in a collective for these
            ranks = [r for r in ranks if r not in waiting]
        over = key if hang.bound <= (config.distributed_strategy.heartbeat_timeout or 0) else \
            f"{hang.bound:.0f}s ({STEP_FACTOR:g} x the longest step, above {key})"
        how = f"hung: alive, but no rank completed a step for {hang.seconds:.0f}s, over {over}"
    steps = {hang.beats[r].step for r in ranks if r in hang.beats}
    step = min(steps) if steps and None not in steps else None
    total = config.trainer.max_steps if config.trainer.max_steps > 0 else None
    at = f" at step {step}" + (f" of {total}" if total else "") if step else " before its first step (starting up or resuming)"
    where = "; ".join(f"rank {r} was in {s}" for r in hang.ranks if (s := stopped_at(log_dir, r)))
    who = ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))
    return (f"nxd train: {who} stopped taking part first ({how}){at}" + ("; nxd train stopped the job" if hang.stopped_job else "")
            + (f"; when stopped, {where}" if where else ""))


def _node(record: dict | None, me: int | None, rank: int, per_node: int) -> int:
    """The node a rank ran on, as the user knows it: its record's, else this node (a rank this
    node's torchrun reported), else the rendezvous order."""
    if record is not None and "node" in record:
        return int(record["node"])
    return me if me is not None else rank // per_node


def _logged_step(metrics_file: str, log_dir: Path) -> int | None:
    """The step in progress by rank 0's log (the last logged step + 1), or None."""
    from nxd_training.exp_manager import read_metrics

    try:
        steps = [r["step"] for r in read_metrics(log_dir, filename=metrics_file) if "step" in r]
    except (OSError, ValueError):
        return None
    return max(steps) + 1 if steps else None
