"""Optimizer state of expert-parallel parameters in checkpoints: each EP rank holds the state of its
own experts, so a state dict gathers it over the EP group (dimension 0 is the expert dimension, as
for the weights, whose ``state_dict`` nxd-moe gathers the same way) and loading keeps this rank's
experts. The state dict then loads at any EP degree."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from nxd_core_parallel.grads import is_expert_parallel


def _split(param: torch.Tensor) -> tuple[Any, int, int] | None:
    """``(group, size, rank)`` of ``param``'s expert-parallel group, or None when it is not split."""
    group = getattr(param, "expert_model_parallel_group", None) if is_expert_parallel(param) else None
    if group is None or dist.get_world_size(group) == 1:
        return None
    return group, dist.get_world_size(group), dist.get_rank(group)


def _map_expert_state(state_dict: dict, params: list[torch.Tensor],
                      convert: Callable[[torch.Tensor, torch.Tensor, tuple[Any, int, int]], torch.Tensor]) -> dict:
    """``state_dict`` with ``convert(value, param, (group, size, rank))`` applied to every state
    tensor of each split expert-parallel parameter, keys in sorted order (so collectives pair up
    across ranks). The optimizer's own state is not modified."""
    state = dict(state_dict["state"])
    for idx, param in enumerate(params):
        split = _split(param)
        if split is None or idx not in state:
            continue
        entry = dict(state[idx])
        for key in sorted(entry):
            if torch.is_tensor(entry[key]):
                entry[key] = convert(entry[key], param, split)
        state[idx] = entry
    return {**state_dict, "state": state}


def _gathered(value: torch.Tensor, param: torch.Tensor, split: tuple[Any, int, int]) -> torch.Tensor:
    group, size, _ = split
    if value.shape != param.shape:  # not per-element (e.g. Adam's step)
        return value
    pieces = [torch.empty_like(value) for _ in range(size)]
    dist.all_gather(pieces, value.contiguous(), group=group)
    return torch.cat(pieces, dim=0)


def _sliced(value: torch.Tensor, param: torch.Tensor, split: tuple[Any, int, int]) -> torch.Tensor:
    _, size, rank = split
    local = param.shape[0]
    if value.dim() != param.dim() or value.shape[0] != local * size or value.shape[1:] != param.shape[1:]:
        return value  # not every expert's (already local, or not per-element)
    return value[rank * local:(rank + 1) * local]


def gather_expert_state(state_dict: dict, params: list[torch.Tensor]) -> dict:
    """``state_dict`` (a torch optimizer's, over ``params`` in order) with every per-element state
    tensor of an expert-parallel parameter gathered over its EP group. Collective over the EP group:
    every rank must call it. The optimizer's own state is not modified."""
    return _map_expert_state(state_dict, params, _gathered)


def slice_expert_state(state_dict: dict, params: list[torch.Tensor]) -> dict:
    """``state_dict`` with the state of each expert-parallel parameter cut to this rank's experts
    where it holds every expert (saved by :func:`gather_expert_state` or at EP=1)."""
    return _map_expert_state(state_dict, params, _sliced)
