"""How a tensor-parallel tensor is cut across TP ranks, and how to re-cut it for another TP size.

The description comes from nxd-tensor-parallel's parameter attributes: ``tensor_model_parallel``,
``partition_dim``, ``partition_stride`` (Megatron stride: the full tensor is split into
``tp * stride`` chunks and rank ``r`` holds chunks ``r, r + tp, ...``), ``fused_splits`` (the local
shard concatenates independently sharded pieces of these local sizes, each piece sharded
contiguously: ``fused_splits`` alone describes the layout, and a stride recorded beside it, as
older checkpoints did for Llama's ``gate_up_proj``, is ignored rather than applied a second time
inside each piece) and ``kv_size_multiplier`` (GQA K/V
replicated over TP, nxd-tensor-parallel's Megatron layout: TP rank ``r`` holds piece ``r // m`` of
the real tensor, so the real tensor is the shards of ranks ``0, m, 2m, ...``). For a fused QKV
parameter the multiplier applies to the K and V pieces (all pieces but the first).

A ``pad=True`` layer (``unpadded_size`` attribute) pads the full tensor along ``dim`` with zeros
to a multiple of ``tp x pad_alignment_size_per_rank``: checkpoints record the real size, merging
drops the padding and splitting re-pads for the target TP size.

A fused QKV tensor in Megatron's interleaved row order (``qkv_interleave`` = ``(groups, q heads
per group, head_dim)``, nxd-tensor-parallel's ``GroupedQKVColumnParallelLinear``) is sharded as the
fused ``[q; k; v]`` tensor above; merging re-interleaves it and splitting de-interleaves first, so
the checkpoint holds the one-device model's tensor.

A tensor of attention heads padded so TP divides them (``head_padding`` = ``(query heads, KV heads,
query slots per KV group, KV groups, head_dim)``, nxd-tensor-parallel's ``HeadPadding``: Llama's
``qkv_proj`` fused ``[q; k; v]``, its ``o_proj`` input columns) is sharded as the padded tensor above;
merging drops the padded heads and splitting puts zero heads back, so the checkpoint holds the
real heads and loads at any TP.

Checkpoints written before the Megatron KV layout used the tiled one (rank ``r`` held piece
``r % (tp / m)``); their metadata lacks ``kv_replicas`` and is read as ``"tiled"``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

import torch

from nxd_tensor_parallel.modules.kv_heads import HeadPadding, interleaved_to_fused


@dataclass(frozen=True)
class Sharding:
    dim: int
    stride: int = 1
    #: local piece sizes along ``dim`` (None: a single piece)
    fused_splits: tuple[int, ...] | None = None
    kv_size_multiplier: int = 1
    #: where a KV piece's replicas sit: "adjacent" (ranks j*m .. j*m+m-1, current) or "tiled" (legacy)
    kv_replicas: str = "adjacent"
    #: the real (unpadded) full size along ``dim`` of a ``pad=True`` tensor; None: no padding
    size: int | None = None
    #: padding makes each rank's shard a multiple of this
    pad_alignment: int = 1
    #: (groups, q heads per group, head_dim): the full tensor is the fused [q; k; v] one in Megatron's
    #: per-group interleaved row order
    qkv_interleave: tuple[int, int, int] | None = None
    #: (query heads, KV heads, query slots per KV group, KV groups, head_dim): the sharded tensor holds
    #: attention heads padded so TP divides them; fused pieces mean ``[q; k; v]``, else ``q`` alone
    head_padding: tuple[int, int, int, int, int] | None = None

    def __post_init__(self) -> None:
        if self.fused_splits and self.stride != 1:
            object.__setattr__(self, "stride", 1)  # fused_splits already describes the whole layout
        if self.kv_replicas not in ("adjacent", "tiled"):
            raise ValueError(f"kv_replicas must be 'adjacent' or 'tiled', got {self.kv_replicas!r}")
        if self.size is not None and (self.fused_splits or self.stride != 1 or self.kv_size_multiplier != 1):
            raise ValueError("a padded (pad=True) tensor must be a single contiguous piece: no fused_splits, stride "
                             "or kv_size_multiplier")

    def padded_size(self, tp: int) -> int:
        """The full size along ``dim`` with the padding a ``tp``-way split needs."""
        assert self.size is not None
        return self.size + -self.size % (tp * self.pad_alignment)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["fused_splits"] = list(self.fused_splits) if self.fused_splits else None
        for key in ("qkv_interleave", "head_padding"):
            if d[key] is None:
                del d[key]  # metadata of other tensors stays as before
            else:
                d[key] = list(d[key])
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any] | None) -> Sharding | None:
        if not d:
            return None
        fs = d.get("fused_splits")
        mult = int(d.get("kv_size_multiplier", 1))
        size, interleave, heads = d.get("size"), d.get("qkv_interleave"), d.get("head_padding")
        return cls(int(d["dim"]), int(d.get("stride", 1)), tuple(int(x) for x in fs) if fs else None, mult,
                   str(d.get("kv_replicas", "tiled" if mult > 1 else "adjacent")),
                   None if size is None else int(size), int(d.get("pad_alignment", 1)),
                   None if interleave is None else tuple(int(x) for x in interleave),
                   None if heads is None else tuple(int(x) for x in heads))

    def head_layout(self) -> tuple[HeadPadding, int, bool]:
        """``(padded layout, head_dim, kv)`` of a ``head_padding`` tensor (``kv``: fused ``[q; k; v]``)."""
        assert self.head_padding is not None
        *layout, head_dim = self.head_padding
        return HeadPadding(*layout), head_dim, self.fused_splits is not None

    def piece_multipliers(self) -> list[int]:
        if not self.fused_splits:
            return [self.kv_size_multiplier]
        return [1] + [self.kv_size_multiplier] * (len(self.fused_splits) - 1)


def sharding_of(tensor: Any) -> Sharding | None:
    """The sharding a parameter declares through its attributes, or None if it is replicated."""
    if not getattr(tensor, "tensor_model_parallel", False):
        return None
    fused = getattr(tensor, "fused_splits", None)
    return Sharding(
        dim=int(getattr(tensor, "partition_dim", 0)),
        stride=int(getattr(tensor, "partition_stride", 1) or 1),
        fused_splits=tuple(int(x) for x in fused) if fused else None,
        kv_size_multiplier=int(getattr(tensor, "kv_size_multiplier", 1) or 1),
        size=None if getattr(tensor, "unpadded_size", None) is None else int(tensor.unpadded_size),
        pad_alignment=int(getattr(tensor, "pad_alignment_size_per_rank", 1) or 1),
        qkv_interleave=tuple(tensor.qkv_interleave) if getattr(tensor, "qkv_interleave", None) else None,
        head_padding=tuple(tensor.head_padding) if getattr(tensor, "head_padding", None) else None,
    )


def global_shape(local_shape: tuple[int, ...], sharding: Sharding | None, tp: int) -> list[int]:
    """The shape of the full (unsharded) tensor."""
    shape = list(local_shape)
    if sharding is None:
        return shape
    if sharding.size is not None:
        shape[sharding.dim] = sharding.size
        return shape
    if sharding.head_padding is not None:
        padding, head_dim, kv = sharding.head_layout()
        shape[sharding.dim] = len(padding.real_rows(head_dim, kv))
        return shape
    pieces = list(sharding.fused_splits) if sharding.fused_splits else [shape[sharding.dim]]
    shape[sharding.dim] = sum(p * tp // m for p, m in zip(pieces, sharding.piece_multipliers()))
    return shape


def _unique_shards(shards: list[torch.Tensor], mult: int, replicas: str) -> list[torch.Tensor]:
    """One shard per distinct KV piece, in piece order."""
    return shards[::mult] if replicas == "adjacent" else shards[: len(shards) // mult]


def _merge_piece(shards: list[torch.Tensor], dim: int, stride: int, mult: int, replicas: str) -> torch.Tensor:
    shards = _unique_shards(shards, mult, replicas)
    if stride == 1:
        return torch.cat(shards, dim=dim)
    chunked = [s.chunk(stride, dim=dim) for s in shards]
    return torch.cat([chunked[r][j] for j in range(stride) for r in range(len(shards))], dim=dim)


def _interleave_order(sharding: Sharding) -> torch.Tensor:
    assert sharding.qkv_interleave is not None
    return interleaved_to_fused(*sharding.qkv_interleave)


def merge_shards(shards: list[torch.Tensor], sharding: Sharding) -> torch.Tensor:
    """The full tensor from every TP rank's shard (in TP-rank order), without TP padding."""
    if sharding.qkv_interleave is not None:
        fused = merge_shards(shards, replace(sharding, qkv_interleave=None))
        order = _interleave_order(sharding).to(fused.device)
        return torch.empty_like(fused).index_copy_(sharding.dim, order, fused)
    if sharding.head_padding is not None:
        padding, head_dim, kv = sharding.head_layout()
        return padding.unpad(merge_shards(shards, replace(sharding, head_padding=None)), sharding.dim, head_dim, kv)
    if sharding.size is not None:
        return torch.cat(shards, dim=sharding.dim).narrow(sharding.dim, 0, sharding.size)
    if not sharding.fused_splits:
        return _merge_piece(shards, sharding.dim, sharding.stride, sharding.kv_size_multiplier, sharding.kv_replicas)
    per_rank = [s.split(list(sharding.fused_splits), dim=sharding.dim) for s in shards]
    return torch.cat([
        _merge_piece([p[i] for p in per_rank], sharding.dim, sharding.stride, mult, sharding.kv_replicas)
        for i, mult in enumerate(sharding.piece_multipliers())
    ], dim=sharding.dim)


def _split_piece(full: torch.Tensor, tp: int, rank: int, dim: int, stride: int, mult: int, name: str,
                 replicas: str = "adjacent") -> torch.Tensor:
    parts = tp // mult
    if parts < 1 or tp % mult:
        raise ValueError(f"{name}: kv_size_multiplier {mult} does not divide tensor parallel size {tp}")
    part_rank = rank // mult if replicas == "adjacent" else rank % parts
    size = full.shape[dim]
    if size % (parts * stride):
        raise ValueError(f"{name}: size {size} along dim {dim} is not divisible into {parts * stride} TP chunks")
    chunks = full.chunk(parts * stride, dim=dim)
    return torch.cat(chunks[part_rank::parts], dim=dim) if stride > 1 else chunks[part_rank]


def split_full(full: torch.Tensor, sharding: Sharding, tp: int, rank: int, name: str = "tensor") -> torch.Tensor:
    """This TP rank's shard of ``full`` for a parameter described by ``sharding`` at size ``tp``."""
    if sharding.qkv_interleave is not None:
        fused = full.index_select(sharding.dim, _interleave_order(sharding).to(full.device))
        return split_full(fused, replace(sharding, qkv_interleave=None), tp, rank, name)
    if sharding.head_padding is not None:
        padding, head_dim, kv = sharding.head_layout()
        real = len(padding.real_rows(head_dim, kv))
        if full.shape[sharding.dim] != real:
            raise ValueError(f"{name}: size {full.shape[sharding.dim]} along dim {sharding.dim}, expected the real "
                             f"(unpadded) heads' {real}")
        padded = padding.pad(full, sharding.dim, head_dim, kv)
        return split_full(padded, replace(sharding, head_padding=None), tp, rank, name)
    if sharding.size is not None:
        if full.shape[sharding.dim] != sharding.size:
            raise ValueError(f"{name}: size {full.shape[sharding.dim]} along dim {sharding.dim}, expected the real "
                             f"(unpadded) size {sharding.size}")
        widths = [0, 0] * (full.dim() - 1 - sharding.dim) + [0, sharding.padded_size(tp) - sharding.size]
        return torch.nn.functional.pad(full, widths).chunk(tp, dim=sharding.dim)[rank].clone()
    if not sharding.fused_splits:
        return _split_piece(full, tp, rank, sharding.dim, sharding.stride, sharding.kv_size_multiplier, name,
                            sharding.kv_replicas)
    mults = sharding.piece_multipliers()
    global_pieces = [p * tp // m for p, m in zip(sharding.fused_splits, mults)]
    if sum(global_pieces) != full.shape[sharding.dim]:
        raise ValueError(f"{name}: fused pieces {global_pieces} do not add up to {full.shape[sharding.dim]}")
    pieces = full.split(global_pieces, dim=sharding.dim)
    return torch.cat([_split_piece(p, tp, rank, sharding.dim, sharding.stride, m, name, sharding.kv_replicas)
                      for p, m in zip(pieces, mults)], dim=sharding.dim)
