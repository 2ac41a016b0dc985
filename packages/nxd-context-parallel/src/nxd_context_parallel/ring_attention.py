"""Ring attention: exact softmax attention over a sequence split across context-parallel ranks.

Each CP rank holds its queries, keys and values for its chunks of the sequence
(:mod:`nxd_context_parallel.layout`). Keys/values travel around the ring of CP ranks
(``send`` to the next rank, ``recv`` from the previous one, point-to-point ops every backend has,
gloo included); every rank attends its queries to each visiting block and merges the partial
results exactly through their log-sum-exp. Under a causal mask a (query chunk, key chunk) pair is
full when the key chunk comes first, triangular when it is the same chunk and skipped when it
comes later. The backward pass sends each block's key/value gradient along with the block, so it
arrives back at its owner after a full turn.

The arithmetic runs in fp32 whatever the input dtype (the log-sum-exp merge needs it). Values may
have another head size than queries/keys (DeepSeek's multi-head latent attention: ``qk_nope +
qk_rope`` vs ``v_head_dim``): keys and values travel as one ``[k | v]`` tensor, and torch's fused
CPU kernel, which wants one head size, sees them zero-padded to the larger (exact: a zero value
column gives a zero output column; zero query/key columns add nothing to the scores).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist

from nxd_context_parallel.layout import chunk_ids, chunks_per_rank

_FULL, _DIAG, _SKIP = "full", "diag", "skip"


class _Ring:
    """Send to the next CP rank, receive from the previous one (global ranks for the p2p ops)."""

    def __init__(self, group: Any) -> None:
        self.group = group if group is not None else dist.group.WORLD
        self.size = dist.get_world_size(self.group) if dist.is_initialized() else 1
        self.rank = dist.get_rank(self.group) if dist.is_initialized() else 0
        if self.size > 1:
            self.next = dist.get_global_rank(self.group, (self.rank + 1) % self.size)
            self.prev = dist.get_global_rank(self.group, (self.rank - 1) % self.size)

    def shift(self, tensor: torch.Tensor, tag: int) -> tuple[torch.Tensor, list[Any]]:
        """Start sending ``tensor`` to the next rank and receiving the previous rank's; wait on the works."""
        tensor = tensor.contiguous()
        received = torch.empty_like(tensor)
        works = [dist.isend(tensor, self.next, group=self.group, tag=tag),
                 dist.irecv(received, self.prev, group=self.group, tag=tag)]
        return received, works

    def source(self, step: int) -> int:
        """The CP rank whose key/value block this rank holds at ring step ``step``."""
        return (self.rank - step) % self.size


def _kind(q_chunk: int, k_chunk: int, causal: bool) -> str:
    if not causal or k_chunk < q_chunk:
        return _FULL
    return _DIAG if k_chunk == q_chunk else _SKIP


def _scores(q: torch.Tensor, k: torch.Tensor, scale: float, diag: bool) -> torch.Tensor:
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    if diag:
        upper = torch.ones(s.shape[-2], s.shape[-1], dtype=torch.bool, device=s.device).triu(1)
        s = s.masked_fill(upper, float("-inf"))
    return s


def _fused(t: torch.Tensor) -> bool:
    """Whether torch's fused flash kernels (which return the log-sum-exp) serve this device;
    elsewhere the blocks use the explicit fp32 arithmetic below."""
    return t.device.type == "cpu"


def _pad_to(t: torch.Tensor, size: int) -> torch.Tensor:
    """``t`` with zero columns appended to its last dimension up to ``size``."""
    return t if t.shape[-1] == size else torch.nn.functional.pad(t, (0, size - t.shape[-1]))


def _block_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                   diag: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out, lse)`` of one block (fp32, equal head counts); ``diag``: causal within the block."""
    if _fused(q):
        d = max(q.shape[-1], v.shape[-1])  # the fused kernel wants one head size (module docstring)
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            _pad_to(q, d).contiguous(), _pad_to(k, d).contiguous(), _pad_to(v, d).contiguous(), 0.0, diag,
            scale=scale)
        return out[..., :v.shape[-1]], lse
    s = _scores(q, k, scale, diag)
    lse = torch.logsumexp(s, dim=-1)
    return torch.matmul(torch.exp(s - lse.unsqueeze(-1)), v), lse


def _block_backward(grad: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                    lse: torch.Tensor, delta: torch.Tensor, scale: float,
                    diag: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dq, dk, dv)`` of one block given the *merged* output and log-sum-exp of its query rows."""
    if _fused(q):
        dqk, dv_size = q.shape[-1], v.shape[-1]
        d = max(dqk, dv_size)
        dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            *(_pad_to(t, d).contiguous() for t in (grad, q, k, v, out)), lse.contiguous(), 0.0, diag, scale=scale)
        return dq[..., :dqk], dk[..., :dqk], dv[..., :dv_size]
    p = torch.exp(_scores(q, k, scale, diag) - lse.unsqueeze(-1))
    dv = torch.matmul(p.transpose(-1, -2), grad)
    ds = p * (torch.matmul(grad, v.transpose(-1, -2)) - delta.unsqueeze(-1))
    return torch.matmul(ds, k) * scale, torch.matmul(ds.transpose(-1, -2), q) * scale, dv


def _expand(kv: torch.Tensor, groups: int) -> torch.Tensor:
    # each KV head serves `groups` consecutive query heads (as LlamaCoreAttention's repeat_interleave)
    return kv.repeat_interleave(groups, dim=1) if groups > 1 else kv


def _fold(grad: torch.Tensor, groups: int) -> torch.Tensor:
    if groups == 1:
        return grad
    b, h, s, d = grad.shape
    return grad.view(b, h // groups, groups, s, d).sum(2)


def _merge(out: torch.Tensor | None, lse: torch.Tensor | None, block_out: torch.Tensor,
           block_lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if out is None or lse is None:
        return block_out, block_lse
    new_lse = torch.logaddexp(lse, block_lse)
    return (out * torch.exp(lse - new_lse).unsqueeze(-1) + block_out * torch.exp(block_lse - new_lse).unsqueeze(-1),
            new_lse)


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: Any, causal: bool,
                load_balance: bool, scale: float) -> torch.Tensor:
        ring = _Ring(group)
        n = chunks_per_rank(load_balance)
        groups = q.shape[1] // k.shape[1]
        qf = q.float()
        q_chunks = qf.chunk(n, dim=2)
        q_ids = chunk_ids(ring.rank, ring.size, load_balance)
        outs: list[torch.Tensor | None] = [None] * n
        lses: list[torch.Tensor | None] = [None] * n
        split = [k.shape[-1], v.shape[-1]]
        kv = torch.cat([k, v], dim=-1)  # one message per hop; the head sizes may differ
        for step in range(ring.size):
            pending = ring.shift(kv, tag=step) if step < ring.size - 1 else None
            k_ids = chunk_ids(ring.source(step), ring.size, load_balance)
            k_chunks, v_chunks = (t.float().chunk(n, dim=2) for t in kv.split(split, dim=-1))
            for i, qi in enumerate(q_ids):
                for j, kj in enumerate(k_ids):
                    kind = _kind(qi, kj, causal)
                    if kind == _SKIP:
                        continue
                    block_out, block_lse = _block_forward(q_chunks[i], _expand(k_chunks[j], groups),
                                                          _expand(v_chunks[j], groups), scale, kind == _DIAG)
                    outs[i], lses[i] = _merge(outs[i], lses[i], block_out, block_lse)
            if pending is not None:
                kv, works = pending
                for work in works:
                    work.wait()
        out = torch.cat(outs, dim=2)  # type: ignore[arg-type]
        lse = torch.cat(lses, dim=2)  # type: ignore[arg-type]
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.group, ctx.causal, ctx.load_balance, ctx.scale = group, causal, load_balance, scale
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, v, out, lse = ctx.saved_tensors
        ring = _Ring(ctx.group)
        n = chunks_per_rank(ctx.load_balance)
        groups = q.shape[1] // k.shape[1]
        scale, causal = ctx.scale, ctx.causal
        qf, do = q.float(), grad_out.float()
        delta = (do * out).sum(-1)  # rowsum(dO * O): the softmax backward's correction term
        q_chunks, do_chunks, out_chunks = qf.chunk(n, dim=2), do.chunk(n, dim=2), out.chunk(n, dim=2)
        lse_chunks, delta_chunks = lse.chunk(n, dim=2), delta.chunk(n, dim=2)
        q_ids = chunk_ids(ring.rank, ring.size, ctx.load_balance)
        dq = torch.zeros_like(qf)
        dq_chunks = dq.chunk(n, dim=2)
        split = [k.shape[-1], v.shape[-1]]
        kv = torch.cat([k, v], dim=-1)
        dkv = torch.zeros(kv.shape, dtype=torch.float32, device=kv.device)
        for step in range(ring.size):
            pending = ring.shift(kv, tag=2 * step) if step < ring.size - 1 else None
            k_ids = chunk_ids(ring.source(step), ring.size, ctx.load_balance)
            k_chunks, v_chunks = (t.float().chunk(n, dim=2) for t in kv.split(split, dim=-1))
            dk_chunks, dv_chunks = (t.chunk(n, dim=2) for t in dkv.split(split, dim=-1))
            for i, qi in enumerate(q_ids):
                for j, kj in enumerate(k_ids):
                    kind = _kind(qi, kj, causal)
                    if kind == _SKIP:
                        continue
                    dq_b, dk_b, dv_b = _block_backward(
                        do_chunks[i], q_chunks[i], _expand(k_chunks[j], groups), _expand(v_chunks[j], groups),
                        out_chunks[i], lse_chunks[i], delta_chunks[i], scale, kind == _DIAG)
                    dq_chunks[i].add_(dq_b)
                    dk_chunks[j].add_(_fold(dk_b, groups))
                    dv_chunks[j].add_(_fold(dv_b, groups))
            if ring.size > 1:
                # the block's gradient follows the block; after `size` hops it is back with its owner
                dkv, works = ring.shift(dkv, tag=2 * step + 1)
                for work in works:
                    work.wait()
            if pending is not None:
                kv, works = pending
                for work in works:
                    work.wait()
        dk, dv = dkv.split(split, dim=-1)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None, None


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: Any = None, *, causal: bool = True,
                   load_balance: bool = True, scale: float | None = None) -> torch.Tensor:
    """Attention of this CP rank's queries over the whole (CP-split) sequence.

    ``q``/``k`` ``[batch, heads | kv_heads, local_seq, head_dim]``, ``v`` ``[batch, kv_heads, local_seq,
    v_head_dim]`` (GQA: ``heads`` a multiple of ``kv_heads``; ``v_head_dim`` may differ), holding this rank's chunks in the order of
    :func:`~nxd_context_parallel.layout.chunk_ids` (``load_balance`` as the batch was
    split). ``group``: the CP process group (``None``: the default group). Returns ``[batch, heads,
    local_seq, v_head_dim]`` in ``q``'s dtype; differentiable in ``q``, ``k`` and ``v``.
    """
    if q.dim() != 4 or k.shape[:3] != v.shape[:3] or k.dim() != 4:
        raise ValueError(f"ring_attention expects q, k [b, heads | kv_heads, s, d] and v [b, kv_heads, s, d_v]; got "
                         f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if q.shape[1] % k.shape[1] or q.shape[0] != k.shape[0] or q.shape[2:] != k.shape[2:]:
        raise ValueError(f"ring_attention: heads ({q.shape[1]}) must be a multiple of kv_heads ({k.shape[1]}) and "
                         f"batch/sequence/head_dim must match: q {tuple(q.shape)}, k {tuple(k.shape)}")
    n = chunks_per_rank(load_balance)
    if q.shape[2] % n:
        raise ValueError(f"ring_attention: the local sequence ({q.shape[2]}) must hold {n} equal chunks "
                         f"(load_balance={load_balance})")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    return _RingAttention.apply(q, k, v, group, causal, load_balance, scale)
