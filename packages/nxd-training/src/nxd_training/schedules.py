"""Learning-rate schedules (NxDT / NeMo names) as ``torch.optim.lr_scheduler.LambdaLR``.

Each schedule is a pure function ``lr_at(step) -> lr`` so tests can check values directly; the
scheduler multiplies the optimizer's base lr by ``lr_at(step) / base_lr``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

LrFn = Callable[[int], float]


def _warmup(step: int, lr: float, warmup: int) -> float | None:
    # step counts from 0 before the first optimizer step; warmup reaches lr at step == warmup
    if warmup > 0 and step < warmup:
        return lr * (step + 1) / (warmup + 1)
    return None


def constant(lr: float, warmup_steps: int = 0, **_: object) -> LrFn:
    def lr_at(step: int) -> float:
        value = _warmup(step, lr, warmup_steps)
        return lr if value is None else value

    return lr_at


def _annealing(lr: float, max_steps: int, warmup_steps: int, min_lr: float, constant_steps: int,
               remaining: Callable[[float], float]) -> LrFn:
    """Warmup, hold for ``constant_steps``, then ``min_lr + (lr - min_lr) * remaining(progress)``
    with progress going 0 -> 1 at ``max_steps``."""

    def lr_at(step: int) -> float:
        value = _warmup(step, lr, warmup_steps)
        if value is not None:
            return value
        start = warmup_steps + constant_steps
        if step < start:
            return lr
        frac = min(1.0, (step - start) / max(1, max_steps - start))
        return min_lr + (lr - min_lr) * remaining(frac)

    return lr_at


def linear(lr: float, max_steps: int, warmup_steps: int = 0, min_lr: float = 0.0, constant_steps: int = 0) -> LrFn:
    """Linear decay to ``min_lr`` at ``max_steps`` (NxDT's LinearAnnealingWithWarmUp)."""
    return _annealing(lr, max_steps, warmup_steps, min_lr, constant_steps, lambda frac: 1.0 - frac)


def cosine(lr: float, max_steps: int, warmup_steps: int = 0, min_lr: float = 0.0, constant_steps: int = 0) -> LrFn:
    """Half-cosine from ``lr`` to ``min_lr`` at ``max_steps`` (NeMo's CosineAnnealing). With
    ``constant_steps`` it is NeMo's Megatron variant: warmup ``lr * step / warmup_steps``, cosine
    over ``max_steps - warmup_steps - constant_steps`` steps, then ``min_lr`` held to the end (so
    warmup + constant longer than the run means ``min_lr`` right after warmup, as in NeMo)."""
    if constant_steps <= 0:
        return _annealing(lr, max_steps, warmup_steps, min_lr, 0, lambda frac: 0.5 * (1.0 + math.cos(math.pi * frac)))
    decay_steps = max_steps - warmup_steps - constant_steps

    def lr_at(step: int) -> float:
        if warmup_steps > 0 and step <= warmup_steps:
            return lr * step / warmup_steps
        if decay_steps <= 0 or step > warmup_steps + decay_steps or step > max_steps:
            return min_lr
        ratio = (step - warmup_steps) / decay_steps
        return min_lr + (lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * ratio))

    return lr_at


#: YAML name -> schedule factory (NxDT and NeMo spellings, plus short names)
SCHEDULES: dict[str, Callable[..., LrFn]] = {
    "constant": constant,
    "Constant": constant,
    "ConstantLR": constant,
    "linear": linear,
    "LinearAnnealingWithWarmUp": linear,
    "LinearAnnealing": linear,
    "cosine": cosine,
    "CosineAnnealing": cosine,
}


def schedule_names() -> list[str]:
    return list(SCHEDULES)


def make_lr_fn(name: str, lr: float, max_steps: int | None, warmup_steps: int = 0, min_lr: float = 0.0,
               constant_steps: int = 0) -> LrFn:
    factory = SCHEDULES[name]
    if factory is constant:
        return constant(lr, warmup_steps=warmup_steps)
    if max_steps is None:
        raise ValueError(f"schedule {name!r} needs max_steps (model.optim.sched.max_steps or trainer.max_steps)")
    return factory(lr, max_steps, warmup_steps=warmup_steps, min_lr=min_lr, constant_steps=constant_steps)


def make_scheduler(optimizer: torch.optim.Optimizer, lr_fn: LrFn, base_lr: float) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_fn(step) / base_lr)
