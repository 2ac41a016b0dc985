"""Router statistics travelling with the hidden state between pipeline stages.

A pipeline stage sends exactly one tensor to the next (docs/pipeline.md), so an MoE model's stage
output is its hidden state flattened with the running sum of its layers' :func:`router_statistics`
appended (``2E + 1`` numbers in the hidden state's dtype). The last stage unpacks both and computes
the router losses of the whole model exactly as one process does; backward carries the gradient of
the statistics back to every stage's routers with the hidden state's gradient.
"""

from __future__ import annotations

import torch


def pack_router_statistics(hidden: torch.Tensor, stats: torch.Tensor) -> torch.Tensor:
    """``[hidden.numel() + len(stats)]``: ``hidden`` flattened, then ``stats`` (in ``hidden``'s dtype)."""
    return torch.cat([hidden.reshape(-1), stats.to(hidden.dtype)])


def unpack_router_statistics(packed: torch.Tensor, num_stats: int, batch: int, hidden_size: int
                             ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(hidden [batch, -1, hidden_size], fp32 stats [num_stats])`` (views into ``packed``, so
    gradients flow back into it)."""
    if packed.dim() != 1 or packed.numel() <= num_stats:
        raise ValueError(f"expected a flat pipeline activation with {num_stats} router statistics at its end, got "
                         f"shape {tuple(packed.shape)} (is every stage running the MoE model's pipeline methods?)")
    hidden, stats = packed[:-num_stats], packed[-num_stats:]
    return hidden.view(batch, -1, hidden_size), stats.float()
