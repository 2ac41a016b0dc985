"""Pipeline schedules as plain data: for each pipeline rank, the ordered list of compute actions.

A schedule never talks to the network. The executor (:mod:`nxd_pipeline.executor`) derives every
send/receive from the actions, so a new schedule is only an ordering; :func:`simulate` checks it
(each micro-batch forwarded and backwarded once per stage, no deadlock) and predicts its bubble.

Stage numbering follows Megatron/NxD: with ``p`` ranks and ``v`` virtual stages per rank, model
chunk ``c`` of rank ``r`` is stage ``c * p + r``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

#: action kinds: forward, full backward, backward for the input gradient only, weight gradient only
FORWARD, BACKWARD, BACKWARD_INPUT, BACKWARD_WEIGHT = "F", "B", "I", "W"


@dataclass(frozen=True)
class Action:
    """One compute step of one rank: ``kind`` on local model ``chunk`` for ``microbatch``."""

    kind: str
    chunk: int
    microbatch: int

    def __repr__(self) -> str:
        return f"{self.kind}{self.chunk}.{self.microbatch}"


BuildFn = Callable[[int, int, int, int], list[Action]]


@dataclass(frozen=True)
class PipelineSchedule:
    """A registered schedule: ``build(pp_size, pp_rank, num_microbatches, virtual_size)``
    returns that rank's actions. ``virtual`` says whether it runs several model chunks per rank."""

    name: str
    build: BuildFn
    virtual: bool = False
    description: str = ""

    def actions(self, pp_size: int, pp_rank: int, num_microbatches: int, virtual_size: int = 1) -> list[Action]:
        if virtual_size > 1 and not self.virtual:
            raise ValueError(
                f"pipeline schedule {self.name!r} runs one model chunk per rank, but virtual_pipeline_size="
                f"{virtual_size}; use schedule 'interleaved_1f1b' or virtual_pipeline_size=1"
            )
        return self.build(pp_size, pp_rank, num_microbatches, virtual_size)


# --------------------------------------------------------------------------- the schedules
def gpipe(p: int, r: int, m: int, v: int = 1) -> list[Action]:
    """All forwards, then all backwards (GPipe / NxD "AFAB")."""
    return [Action(FORWARD, 0, i) for i in range(m)] + [Action(BACKWARD, 0, i) for i in range(m)]


def one_f_one_b(p: int, r: int, m: int, v: int = 1) -> list[Action]:
    """PipeDream-flush 1F1B: ``p - r - 1`` warm-up forwards, then alternate, then drain."""
    warmup = min(p - r - 1, m)
    actions = [Action(FORWARD, 0, i) for i in range(warmup)]
    for i in range(m - warmup):
        actions += [Action(FORWARD, 0, warmup + i), Action(BACKWARD, 0, i)]
    actions += [Action(BACKWARD, 0, i) for i in range(m - warmup, m)]
    return actions


def interleaved_1f1b(p: int, r: int, m: int, v: int = 2) -> list[Action]:
    """Megatron's interleaved 1F1B: micro-batches go through chunks in groups of ``p``."""
    if m % p:
        raise ValueError(f"interleaved_1f1b needs num_microbatches divisible by pipeline_parallel_size ({p}), got {m}")
    total = m * v

    def forward_of(k: int) -> Action:
        return Action(FORWARD, (k // p) % v, (k // (p * v)) * p + k % p)

    def backward_of(k: int) -> Action:
        return Action(BACKWARD, v - 1 - (k // p) % v, (k // (p * v)) * p + k % p)

    warmup = total if m == p else min((p - r - 1) * 2 + (v - 1) * p, total)
    actions = [forward_of(k) for k in range(warmup)]
    for k in range(total - warmup):
        actions += [forward_of(warmup + k), backward_of(k)]
    actions += [backward_of(k) for k in range(total - warmup, total)]
    return actions


def zero_bubble_h1(p: int, r: int, m: int, v: int = 1) -> list[Action]:
    """ZB-H1 (Qi et al. 2024): each backward is split into input-grad (I, on the critical path)
    and weight-grad (W, free to move). Built by list-scheduling all ranks with unit costs: a rank
    runs a ready I first, else a ready F while fewer than ``p - r`` micro-batches are in flight
    (1F1B's activation memory), else a pending W to fill what would be a bubble."""
    return _zero_bubble_lists(p, m)[r]


@functools.lru_cache(maxsize=64)
def _zero_bubble_lists(p: int, m: int) -> tuple[list[Action], ...]:
    lists: list[list[Action]] = [[] for _ in range(p)]
    clock = [0.0] * p
    fwd_done: dict[tuple[int, int], float] = {}  # (rank, mb) -> end time of F
    inp_done: dict[tuple[int, int], float] = {}  # (rank, mb) -> end time of I
    next_f, next_i, next_w = [0] * p, [0] * p, [0] * p

    def ready(r: int, kind: str) -> float | None:
        """Time at which rank r's next action of ``kind`` can start, or None if not yet known."""
        if kind == FORWARD:
            i = next_f[r]
            if i >= m or i - next_w[r] >= p - r:
                return None
            return 0.0 if r == 0 else fwd_done.get((r - 1, i))
        i = next_i[r]
        if i >= next_f[r]:
            return None
        if r == p - 1:
            return fwd_done[(r, i)]
        return inp_done.get((r + 1, i))

    while any(next_w[r] < m for r in range(p)):
        r = min((q for q in range(p) if next_w[q] < m), key=lambda q: clock[q])
        t_i, t_f = ready(r, BACKWARD_INPUT), ready(r, FORWARD)
        if t_i is not None and t_i <= clock[r]:
            inp_done[(r, next_i[r])] = clock[r] + 1
            lists[r].append(Action(BACKWARD_INPUT, 0, next_i[r]))
            next_i[r] += 1
        elif t_f is not None and t_f <= clock[r]:
            fwd_done[(r, next_f[r])] = clock[r] + 1
            lists[r].append(Action(FORWARD, 0, next_f[r]))
            next_f[r] += 1
        elif next_w[r] < next_i[r]:
            lists[r].append(Action(BACKWARD_WEIGHT, 0, next_w[r]))
            next_w[r] += 1
        else:  # idle until the earliest known dependency arrives
            upcoming = [t for t in (t_i, t_f) if t is not None]
            others = [clock[q] for q in range(p) if q != r and next_w[q] < m and clock[q] > clock[r]]
            clock[r] = min(upcoming + others) if upcoming or others else clock[r] + 1
            continue
        clock[r] += 1
    return tuple(lists)


BUILTIN_SCHEDULES: tuple[PipelineSchedule, ...] = (
    PipelineSchedule("gpipe", gpipe, description="all forwards then all backwards"),
    PipelineSchedule("1f1b", one_f_one_b, description="one-forward-one-backward (PipeDream-flush)"),
    PipelineSchedule("interleaved_1f1b", interleaved_1f1b, virtual=True,
                     description="Megatron interleaved 1F1B over virtual_pipeline_size chunks per rank"),
    PipelineSchedule("zero_bubble", zero_bubble_h1, description="ZB-H1: backward split into input and weight grads"),
)


# --------------------------------------------------------------------------- checking and timing
@dataclass
class Simulation:
    """Result of :func:`simulate`: the step's makespan and each rank's busy time."""

    makespan: float
    busy: list[float]

    @property
    def bubble_fraction(self) -> float:
        """Mean idle share of the step over ranks: ``1 - busy / makespan``."""
        return sum(1.0 - b / self.makespan for b in self.busy) / len(self.busy)


def simulate(
    schedule: PipelineSchedule | BuildFn,
    p: int,
    m: int,
    v: int = 1,
    cost: dict[str, float] | None = None,
) -> Simulation:
    """Run the schedule's action lists against their data dependencies with per-action ``cost``
    (default F=1, B=2, I=1, W=1; communication free). Raises ``ValueError`` if an action is
    missing or duplicated, or if the ranks deadlock. Used by the tests and the benchmark's
    theoretical bubble."""
    cost = {FORWARD: 1.0, BACKWARD: 2.0, BACKWARD_INPUT: 1.0, BACKWARD_WEIGHT: 1.0, **(cost or {})}
    build = schedule.actions if isinstance(schedule, PipelineSchedule) else schedule
    lists = [build(p, r, m, v) for r in range(p)]
    stages = p * v
    for r, actions in enumerate(lists):
        seen: dict[tuple[str, int, int], int] = {}
        for a in actions:
            key = (a.kind, a.chunk, a.microbatch)
            seen[key] = seen.get(key, 0) + 1
        for c in range(v):
            for i in range(m):
                f = seen.get((FORWARD, c, i), 0)
                b = seen.get((BACKWARD, c, i), 0)
                split = (seen.get((BACKWARD_INPUT, c, i), 0), seen.get((BACKWARD_WEIGHT, c, i), 0))
                if f != 1 or not ((b == 1 and split == (0, 0)) or (b == 0 and split == (1, 1))):
                    raise ValueError(f"rank {r}: chunk {c} micro-batch {i} is not forwarded and backwarded exactly once")
    finish: dict[tuple[str, int, int], float] = {}  # (kind, stage, mb) -> end time
    clock = [0.0] * p
    busy = [0.0] * p
    pos = [0] * p
    while any(pos[r] < len(lists[r]) for r in range(p)):
        progressed = False
        for r in range(p):
            while pos[r] < len(lists[r]):
                a = lists[r][pos[r]]
                s = a.chunk * p + r
                deps: list[tuple[str, int, int]] = []
                if a.kind == FORWARD and s > 0:
                    deps.append((FORWARD, s - 1, a.microbatch))
                if a.kind in (BACKWARD, BACKWARD_INPUT):
                    deps.append((FORWARD, s, a.microbatch))
                    if s < stages - 1:
                        deps.append(("G", s + 1, a.microbatch))
                if a.kind == BACKWARD_WEIGHT:
                    deps.append((BACKWARD_INPUT, s, a.microbatch))
                if any(d not in finish for d in deps):
                    break
                start = max([clock[r]] + [finish[d] for d in deps])
                end = start + cost[a.kind]
                finish[(a.kind, s, a.microbatch)] = end
                if a.kind in (BACKWARD, BACKWARD_INPUT):
                    finish[("G", s, a.microbatch)] = end
                clock[r], busy[r] = end, busy[r] + cost[a.kind]
                pos[r] += 1
                progressed = True
        if not progressed:
            stuck = {r: lists[r][pos[r]] for r in range(p) if pos[r] < len(lists[r])}
            raise ValueError(f"schedule deadlocks: ranks wait forever at {stuck}")
    return Simulation(max(clock), busy)
