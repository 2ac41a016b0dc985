"""Tensor-parallel-aware RNG: a tracker of named RNG states.

Outside a fork every TP rank draws the same numbers (dropout on replicated activations agrees);
inside ``get_rng_tracker().fork()`` each TP rank draws different numbers (dropout on sharded
activations, e.g. attention heads, differs across ranks as it would on the unsharded model's
distinct heads).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from nxd.parallel import ParallelContext, dim_rank, resolve_context

MODEL_PARALLEL_RNG = "model-parallel-rng"
_TP_SEED_OFFSET = 2718  # NxD/Megatron: tp seed = seed + 2718 + tp_rank


def _cuda_in_use() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_initialized()


def _get_rng() -> dict[str, torch.Tensor]:
    state = {"cpu": torch.get_rng_state()}
    if _cuda_in_use():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng(state: dict[str, torch.Tensor]) -> None:
    torch.set_rng_state(state["cpu"])
    if "cuda" in state and _cuda_in_use():
        torch.cuda.set_rng_state(state["cuda"])


class RNGStatesTracker:
    """Named RNG states; ``fork(name)`` runs a block on that state and saves where it ended."""

    def __init__(self) -> None:
        self.states: dict[str, dict[str, torch.Tensor]] = {}
        self.seeds: set[int] = set()

    def reset(self) -> None:
        self.states, self.seeds = {}, set()

    def get_states(self) -> dict[str, dict[str, torch.Tensor]]:
        return {name: {k: v.clone() for k, v in state.items()} for name, state in self.states.items()}

    def set_states(self, states: dict[str, dict[str, torch.Tensor]]) -> None:
        self.states = {name: {k: v.clone() for k, v in state.items()} for name, state in states.items()}

    def add(self, name: str, seed: int) -> None:
        if seed in self.seeds:
            raise ValueError(f"seed {seed} already exists in the RNG tracker")
        if name in self.states:
            raise ValueError(f"RNG state {name!r} already exists in the tracker")
        self.seeds.add(seed)
        saved = _get_rng()
        torch.manual_seed(seed)
        self.states[name] = _get_rng()
        _set_rng(saved)

    @contextlib.contextmanager
    def fork(self, name: str = MODEL_PARALLEL_RNG) -> Iterator[None]:
        if name not in self.states:
            raise KeyError(f"RNG state {name!r} is not in the tracker; call model_parallel_manual_seed(seed) first")
        saved = _get_rng()
        _set_rng(self.states[name])
        try:
            yield
        finally:
            self.states[name] = _get_rng()
            _set_rng(saved)


_TRACKER = RNGStatesTracker()


def get_rng_tracker() -> RNGStatesTracker:
    return _TRACKER


def model_parallel_manual_seed(seed: int, context: ParallelContext | None = None) -> None:
    """Seed the default RNG with ``seed`` (same on every rank) and the tracker's model-parallel
    state with ``seed + 2718 + tp_rank`` (different per TP rank of ``context``, the current one
    when left out)."""
    torch.manual_seed(seed)
    if _cuda_in_use():
        torch.cuda.manual_seed(seed)
    _TRACKER.reset()
    _TRACKER.add(MODEL_PARALLEL_RNG, seed + _TP_SEED_OFFSET + dim_rank(resolve_context(context), "tp"))


# NxD names
get_xla_rng_tracker = get_rng_tracker
model_parallel_xla_manual_seed = model_parallel_manual_seed
XLARNGStatesTracker = RNGStatesTracker
