"""All-pairs (pairwise) test-set generation under constraints, deterministic.

Every pair of values of two different axes that some valid cell can hold appears in at least one
generated cell. Greedy in the style of AETG/IPOG: each new cell starts from an uncovered pair and
fills the remaining axes with the value covering the most still-uncovered pairs, backtracking when a
constraint leaves an axis with no value.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from itertools import combinations, product

Cell = dict[str, str]
#: ``allowed(partial_cell)`` -> False when no valid cell can extend ``partial_cell``
Allowed = Callable[[Mapping[str, str]], bool]


def _completable(axes: Mapping[str, Sequence[str]], allowed: Allowed, partial: Cell) -> Cell | None:
    """A valid full cell extending ``partial`` (first in axis order), or None."""
    free = [a for a in axes if a not in partial]

    def extend(cell: Cell, rest: list[str]) -> Cell | None:
        if not rest:
            return cell
        for value in axes[rest[0]]:
            trial = {**cell, rest[0]: value}
            if allowed(trial):
                done = extend(trial, rest[1:])
                if done is not None:
                    return done
        return None

    return extend(dict(partial), free) if allowed(partial) else None


def feasible_pairs(axes: Mapping[str, Sequence[str]], allowed: Allowed) -> set[tuple[tuple[str, str], tuple[str, str]]]:
    pairs = set()
    for a, b in combinations(axes, 2):
        for va, vb in product(axes[a], axes[b]):
            if _completable(axes, allowed, {a: va, b: vb}) is not None:
                pairs.add(((a, va), (b, vb)))
    return pairs


def _pairs_of(cell: Cell, names: Sequence[str]) -> set[tuple[tuple[str, str], tuple[str, str]]]:
    return {((a, cell[a]), (b, cell[b])) for a, b in combinations(names, 2)}


def pairwise(axes: Mapping[str, Sequence[str]], allowed: Allowed) -> list[Cell]:
    """Cells (axis -> value) covering every feasible pair of axis values at least once."""
    names = list(axes)
    uncovered = feasible_pairs(axes, allowed)
    order = sorted(uncovered, key=lambda p: (names.index(p[0][0]), names.index(p[1][0]), p))
    cells: list[Cell] = []
    while uncovered:
        (a, va), (b, vb) = next(p for p in order if p in uncovered)
        cell: Cell = {a: va, b: vb}
        for axis in names:
            if axis in cell:
                continue
            best, best_gain = None, -1
            for value in axes[axis]:
                trial = {**cell, axis: value}
                if _completable(axes, allowed, trial) is None:
                    continue
                gain = sum(1 for other, ov in trial.items() if other != axis
                           and _ordered((axis, value), (other, ov), names) in uncovered)
                if gain > best_gain:
                    best, best_gain = value, gain
            assert best is not None, (cell, axis)  # _completable(cell) held, so some value extends it
            cell[axis] = best
        full = {n: cell[n] for n in names}
        uncovered -= _pairs_of(full, names)
        cells.append(full)
    return cells


def _ordered(x: tuple[str, str], y: tuple[str, str], names: Sequence[str]) -> tuple[tuple[str, str], tuple[str, str]]:
    return (x, y) if names.index(x[0]) < names.index(y[0]) else (y, x)
