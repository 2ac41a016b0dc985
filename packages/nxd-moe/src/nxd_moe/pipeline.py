"""Router statistics travelling with the hidden state between pipeline stages.

A pipeline stage sends exactly one tensor to the next (docs/pipeline.md), so an MoE model's stage
output is its hidden state flattened with the running sum of its layers' :func:`router_statistics`
appended (``2E + 1`` fp32 numbers). The last stage unpacks both and computes the router losses of
the whole model exactly as one process does; backward carries the gradient of the statistics back
to every stage's routers with the hidden state's gradient.

In a 16-bit activation the statistics travel bit for bit as fp32 (each fp32 number's bytes as two
16-bit elements), and so does their gradient: the pack and unpack are autograd functions whose
backward rebuilds the other side's bytes (the gradient of the packed tensor is never summed, which
could change such bytes).
"""

from __future__ import annotations

import torch


def _as_carrier(stats: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """fp32 ``stats`` in ``dtype``: bytes reinterpreted for 16-bit types, values cast otherwise (exact)."""
    stats = stats.float().contiguous()
    return stats.view(dtype) if dtype.itemsize == 2 else stats.to(dtype)


def _from_carrier(carrier: torch.Tensor) -> torch.Tensor:
    carrier = carrier.clone()  # own storage: a reinterpreting view needs an aligned offset
    return carrier.view(torch.float32) if carrier.dtype.itemsize == 2 else carrier.float()


class _Pack(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden: torch.Tensor, stats: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.hidden_shape = hidden.shape
        return torch.cat([hidden.reshape(-1), _as_carrier(stats, hidden.dtype)])

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        n = ctx.hidden_shape.numel()
        return grad[:n].view(ctx.hidden_shape), _from_carrier(grad[n:])


class _Unpack(torch.autograd.Function):
    @staticmethod
    def forward(ctx, packed: torch.Tensor, num_carrier: int, batch: int,  # type: ignore[override]
                hidden_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        ctx.dtype = packed.dtype
        hidden = packed[:-num_carrier].view(batch, -1, hidden_size).clone()
        return hidden, _from_carrier(packed[-num_carrier:])

    @staticmethod
    def backward(ctx, grad_hidden: torch.Tensor, grad_stats: torch.Tensor  # type: ignore[override]
                 ) -> tuple[torch.Tensor, None, None, None]:
        # unused outputs' gradients arrive as zeros (materialized), so both are tensors
        return torch.cat([grad_hidden.reshape(-1), _as_carrier(grad_stats, ctx.dtype)]), None, None, None


def _carrier_size(num_stats: int, dtype: torch.dtype) -> int:
    return 2 * num_stats if dtype.itemsize == 2 else num_stats


def pack_router_statistics(hidden: torch.Tensor, stats: torch.Tensor) -> torch.Tensor:
    """One flat tensor in ``hidden``'s dtype: ``hidden`` flattened, then the fp32 ``stats``
    (differentiable in both)."""
    return _Pack.apply(hidden, stats)


def unpack_router_statistics(packed: torch.Tensor, num_stats: int, batch: int, hidden_size: int
                             ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(hidden [batch, -1, hidden_size], fp32 stats [num_stats])`` from
    :func:`pack_router_statistics`'s output (differentiable in both)."""
    carrier = _carrier_size(num_stats, packed.dtype)
    if packed.dim() != 1 or packed.numel() <= carrier:
        raise ValueError(f"expected a flat pipeline activation with {num_stats} router statistics at its end, got "
                         f"shape {tuple(packed.shape)} (is every stage running the MoE model's pipeline methods?)")
    return _Unpack.apply(packed, carrier, batch, hidden_size)
