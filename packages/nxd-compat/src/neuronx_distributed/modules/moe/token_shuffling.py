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

__all__ = ["all_to_all_for_shuffle", "destroy_token_shuffle_group", "get_token_shuffle_group",
           "get_token_shuffle_group_size", "get_token_shuffle_replica_groups", "initialize_token_shuffle_group",
           "token_shuffle", "token_unshuffle"]

#: (context id, size) -> (the context, this rank's token shuffle group, every group's ranks). The
#: context is held and compared: an id alone can be reused by a later context on one rank and not on
#: another, and then only some ranks would create the groups (a hang in new_group)
_GROUPS: dict[tuple[int, int], tuple[Any, Any, list[list[int]]]] = {}
_CURRENT: list[Any] = [1, None, None]  # [size, group, all groups' ranks] the functions below use


def initialize_token_shuffle_group(token_shuffle_group_size: int = 1) -> None:
    """NxD's ``parallel_state.initialize_token_shuffle_group``: groups of ``size`` consecutive
    data-parallel ranks (same PP/CP/TP coordinates). Collective: every rank calls it."""
    size = int(token_shuffle_group_size)
    context = current_parallel_context()
    dp = context.dp.size if context is not None else 1
    if size < 1 or dp % size:
        raise ValueError(f"token_shuffle_group_size ({size}) must divide the data-parallel size ({dp})")
    key = (id(context), size)
    if key not in _GROUPS or _GROUPS[key][0] is not context:
        sizes = context.sizes() if context is not None else {"tp": 1, "pp": 1, "cp": 1}
        world = dist.get_world_size() if dist.is_initialized() else 1
        mine, everyone = None, []
        for dp_ranks in rank_layout(world, tp=sizes["tp"], pp=sizes["pp"], cp=sizes["cp"])["dp"]:
            for first in range(0, len(dp_ranks), size):
                ranks = list(dp_ranks[first:first + size])
                everyone.append(ranks)
                if size > 1:
                    group = dist.new_group(ranks)  # every rank creates every group, in the same order
                    if dist.get_rank() in ranks:
                        mine = group
        _GROUPS[key] = (context, mine, everyone)
    _CURRENT[:] = [size, *_GROUPS[key][1:]]


def get_token_shuffle_group(as_list: bool = False) -> Any:
    """This rank's token shuffle group (NxD's ``parallel_state`` name; ``as_list``: every group's
    ranks). Size 1 has no process group (nothing is exchanged): ``None``."""
    _initialized()
    return _CURRENT[2] if as_list else _CURRENT[1]


def get_token_shuffle_replica_groups() -> list[list[int]]:
    _initialized()
    return _CURRENT[2]


def get_token_shuffle_group_size() -> int:
    _initialized()
    return _CURRENT[0]


def destroy_token_shuffle_group() -> None:
    _CURRENT[:] = [1, None, None]


def _initialized() -> None:
    if _CURRENT[2] is None:
        raise RuntimeError("token_shuffle parallel group is not initialized (initialize_token_shuffle_group)")


def all_to_all_for_shuffle(hidden_states: torch.Tensor, input_is_sequence_parallel: bool = True) -> torch.Tensor:
    """Rows ``[T, H]`` split in ``size`` equal parts, part ``j`` sent to group rank ``j``."""
    size, group, _ = _CURRENT
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
