"""Context parallelism: the sequence split over CP ranks, ring attention across them.

See docs/parallel.md ("Context parallelism") for the layout and its limits."""

from nxd_context_parallel.batch import (
    get_batch_on_this_context_parallel_rank,
    split_batch_for_context_parallel,
)
from nxd_context_parallel.layout import check_divisible, chunk_ids, local_indices, local_positions
from nxd_context_parallel.loss import context_parallel_token_mean
from nxd_context_parallel.ring_attention import ring_attention

__all__ = [
    "check_divisible",
    "chunk_ids",
    "context_parallel_token_mean",
    "get_batch_on_this_context_parallel_rank",
    "local_indices",
    "local_positions",
    "ring_attention",
    "split_batch_for_context_parallel",
]

__version__ = "0.1.0"
