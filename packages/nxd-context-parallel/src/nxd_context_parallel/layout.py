"""Which pieces of the sequence a context-parallel rank holds.

The sequence is cut into equal chunks. With ``load_balance`` (the default, Megatron-Core's and
torchtitan's layout) it is cut into ``2 * cp`` chunks and CP rank ``r`` holds chunks ``r`` and
``2 * cp - 1 - r``: under a causal mask every rank then has the same amount of attention work.
Without it (NxD's ``get_batch_on_this_context_parallel_rank`` layout) there are ``cp`` chunks and
rank ``r`` holds chunk ``r``; the last rank then does ``cp`` times the work of the first.
"""

from __future__ import annotations

import torch

from nxd_tensor_parallel.layout_rules import SizeNames, context_chunks


def chunks_per_rank(load_balance: bool) -> int:
    return 2 if load_balance else 1


def chunk_ids(cp_rank: int, cp_size: int, load_balance: bool = True) -> tuple[int, ...]:
    """Global indices of the chunks CP rank ``cp_rank`` holds, in the order it holds them."""
    if not 0 <= cp_rank < cp_size:
        raise ValueError(f"cp_rank {cp_rank} is outside [0, {cp_size})")
    return (cp_rank, 2 * cp_size - 1 - cp_rank) if load_balance else (cp_rank,)


def check_divisible(seq_length: int, cp_size: int, load_balance: bool = True, what: str = "sequence length") -> int:
    """The length of each equal chunk of the sequence; refused, naming ``what`` was cut, when it
    cannot be cut so (the rule is :func:`nxd_tensor_parallel.layout_rules.context_chunks`)."""
    return context_chunks(seq_length, cp_size, load_balance=load_balance, names=SizeNames(seq=what),
                   hint=f"; pad it or choose a seq_length that is a multiple of {cp_size * chunks_per_rank(load_balance)}")


def local_indices(seq_length: int, cp_rank: int, cp_size: int, load_balance: bool = True,
                  device: torch.device | str | None = None) -> torch.Tensor:
    """Positions ``[0, seq_length)`` of the full sequence that CP rank ``cp_rank`` holds, in local order."""
    chunk = check_divisible(seq_length, cp_size, load_balance)
    return torch.cat([torch.arange(c * chunk, (c + 1) * chunk, device=device)
                      for c in chunk_ids(cp_rank, cp_size, load_balance)])


def local_positions(local_seq_length: int, cp_rank: int, cp_size: int, load_balance: bool = True,
                    past: int = 0, device: torch.device | str | None = None) -> torch.Tensor:
    """RoPE positions of this rank's ``local_seq_length`` tokens (``past`` added)."""
    return local_indices(local_seq_length * cp_size, cp_rank, cp_size, load_balance, device) + past
