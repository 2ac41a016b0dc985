"""``neuronx_distributed.modules.moe.token_shuffling``: NxD's token shuffling before routing
(``MoE(token_shuffle_group_size>1)``; BASE layers, arXiv 2103.16716).

As NxD: each rank permutes its tokens at random (``torch.rand`` argsort, on the default RNG, or
seeded with ``token_shuffle_seed``) and sends an equal share of them to each rank of its token
shuffle group (``token_shuffle_group_size`` consecutive data-parallel ranks of the same TP/PP
coordinates) with one all-to-all; after the MoE layer the all-to-all (its own inverse) and the
inverse permutation put every token back. The layer's output is therefore the unshuffled one's
(the experts see other ranks' tokens, so the load balances better); the router logits returned
are those of the shuffled tokens, as NxD returns them. One difference: NxD reseeds the global RNG
with the seed (``torch.manual_seed``); nxd draws a seeded permutation from its own generator.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from nxd_compat.optional import require

require("nxd_moe", "neuronx_distributed.modules.moe.token_shuffling", "nxd-moe")

from nxd.parallel import current_parallel_context, rank_layout  # noqa: E402
from nxd_moe import all_to_all  # noqa: E402

__all__ = ["all_to_all_for_shuffle", "initialize_token_shuffle_group", "token_shuffle", "token_unshuffle"]

#: (context id, size) -> this rank's token shuffle group; one group set per parallel context
_GROUPS: dict[tuple[int, int], Any] = {}
_CURRENT: list[Any] = [1, None]  # [size, group] of the group the functions below use


def initialize_token_shuffle_group(token_shuffle_group_size: int = 1) -> None:
    """NxD's ``parallel_state.initialize_token_shuffle_group``: groups of ``size`` consecutive
    data-parallel ranks (same PP/CP/TP coordinates). Collective: every rank calls it."""
    size = int(token_shuffle_group_size)
    context = current_parallel_context()
    dp = context.dp.size if context is not None else 1
    if size < 1 or dp % size:
        raise ValueError(f"token_shuffle_group_size ({size}) must divide the data-parallel size ({dp})")
    key = (id(context), size)
    if size > 1 and key not in _GROUPS:
        sizes = context.sizes()
        mine = None
        for dp_ranks in rank_layout(dist.get_world_size(), tp=sizes["tp"], pp=sizes["pp"], cp=sizes["cp"])["dp"]:
            for first in range(0, len(dp_ranks), size):
                ranks = dp_ranks[first:first + size]
                group = dist.new_group(ranks)  # every rank creates every group, in the same order
                if dist.get_rank() in ranks:
                    mine = group
        _GROUPS[key] = mine
    _CURRENT[:] = [size, _GROUPS.get(key)]


def all_to_all_for_shuffle(hidden_states: torch.Tensor, input_is_sequence_parallel: bool = True) -> torch.Tensor:
    """Rows ``[T, H]`` split in ``size`` equal parts, part ``j`` sent to group rank ``j``."""
    size, group = _CURRENT
    if size == 1:
        return hidden_states
    if not input_is_sequence_parallel:
        raise NotImplementedError("all_to_all_for_shuffle(input_is_sequence_parallel=False) is not provided by "
                                  "nxd-compat (MoE shuffles the hidden states it is given)")
    rows = hidden_states.shape[0]
    if rows % size:
        raise ValueError(f"token shuffling sends an equal share of this rank's {rows} tokens to each of the "
                         f"{size} ranks of its group: {rows} is not divisible by token_shuffle_group_size")
    splits = [rows // size] * size
    return all_to_all(hidden_states.contiguous(), splits, splits, group)


def token_shuffle(hidden_states: torch.Tensor, seed: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``hidden_states`` ``[s0, s1, h]`` permuted and exchanged over the group; and the permutation."""
    shape = hidden_states.shape
    flat = hidden_states.reshape(-1, shape[-1])
    generator = torch.Generator(device=flat.device).manual_seed(seed) if seed is not None else None
    permutation = torch.argsort(torch.rand(flat.shape[0], device=flat.device, generator=generator))
    return all_to_all_for_shuffle(flat[permutation]).reshape(shape), permutation


def token_unshuffle(permuted_states: torch.Tensor, permutation: torch.Tensor) -> torch.Tensor:
    """:func:`token_shuffle` undone: the all-to-all back, then the inverse permutation."""
    shape = permuted_states.shape
    back = all_to_all_for_shuffle(permuted_states.reshape(-1, shape[-1]))
    return back[torch.argsort(permutation)].reshape(shape)
