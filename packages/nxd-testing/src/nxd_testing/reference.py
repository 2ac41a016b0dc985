"""Single-process oracles the parity tests share: learnable token data, the plain-torch training
loop a parallel run must match, and relative-error helpers."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch


def token_chain_batch(step: int, *, batch: int, seq: int, vocab: int, mult: int = 3, add: int = 1,
                      seed: int = 100) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, labels)`` ``[batch, seq]`` of a learnable sequence: each next token is
    ``(mult * token + add) % vocab`` from a random start drawn with seed ``seed + step``."""
    g = torch.Generator().manual_seed(seed + step)
    tokens = [torch.randint(0, vocab, (batch,), generator=g)]
    for _ in range(seq):
        tokens.append((mult * tokens[-1] + add) % vocab)
    ids = torch.stack(tokens, dim=1)
    return ids[:, :-1], ids[:, 1:]


@dataclass
class ReferenceRun:
    """What :func:`train_reference` measured, one entry per step."""

    losses: list[float] = field(default_factory=list)
    #: total gradient norms before clipping (only when ``max_norm`` was given)
    grad_norms: list[float] = field(default_factory=list)


def train_reference(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batches: Iterable[Any], *,
                    max_norm: float | None = None,
                    loss_of: Callable[[torch.nn.Module, Any], torch.Tensor] | None = None) -> ReferenceRun:
    """The plain-torch loop: per batch ``loss = model(*batch)`` (or ``loss_of(model, batch)``),
    backward, optional ``clip_grad_norm_``, ``step``, ``zero_grad``."""
    run = ReferenceRun()
    for batch in batches:
        loss = loss_of(model, batch) if loss_of is not None else model(*batch)
        loss.backward()
        if max_norm is not None:
            run.grad_norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)))
        optimizer.step()
        optimizer.zero_grad()
        run.losses.append(float(loss.detach()))
    return run


def max_rel(got: Sequence[float] | Mapping[Any, float], want: Sequence[float] | Mapping[Any, float]) -> float:
    """Largest ``|got - want| / |want|`` over paired values (lists by position, dicts by key)."""
    if isinstance(want, Mapping):
        assert isinstance(got, Mapping) and got.keys() == want.keys(), (sorted(got), sorted(want))
        pairs = [(got[k], want[k]) for k in want]
    else:
        assert len(got) == len(want), (len(got), len(want))
        pairs = list(zip(got, want))
    return max(abs(a - b) / abs(b) for a, b in pairs)


def rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """``max|actual - expected| / max|expected|`` in fp64 (the plain difference when ``expected`` is 0)."""
    scale = expected.abs().max().item()
    diff = (actual.double() - expected.double()).abs().max().item()
    return diff / scale if scale else diff
