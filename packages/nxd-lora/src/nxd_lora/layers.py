"""LoRA adapters for ``nn.Linear`` and nxd's tensor-parallel layers.

An adapter sits beside its (untouched, frozen) base layer and adds ``scale * B(A(dropout(x)))`` to
the base output through a forward hook, so base parameter names never change.

Sharding follows the base layer (the rule PEFT and NxD share):

* column-parallel base (``ColumnParallelLinear``, ``GQAQKVColumnParallelLinear``): A replicated,
  B sharded on the output dim. ``h = x A^T`` is computed on every rank, then passes the same
  region the base input passes (copy: all-reduce of ``dh`` in backward; sequence parallel: gather
  over the sequence, reduce-scatter in backward), so A's gradient is complete.
* row-parallel base: A sharded on the input dim, B replicated. ``h`` is partial per rank and is
  reduced like the base output (all-reduce, or reduce-scatter over the sequence under SP) before B.
* fused bases (q/k/v, gate/up) get one A/B pair per projection; GQA K/V replicas
  (``kv_size_multiplier``) sum their B gradients over the ranks that share a KV head, as the base does.
* ``nn.Embedding`` / vocabulary-parallel ``ParallelEmbedding`` (PEFT's ``Embedding`` layout and
  rule: ``lora_embedding_A`` ``[r, num_embeddings]`` starts at zero, ``lora_embedding_B``
  ``[embedding_dim, r]`` at N(0, 1); the update ``scale * embedding(ids, A^T) B^T``, no dropout). Under
  TP A's columns follow the table's vocabulary rows: each rank looks up its own ids (others zero)
  and the partial ``h`` is reduced like the base output (all-reduce, or reduce-scatter over the
  sequence under SP) before the replicated B.
* ``nn.Conv1d/2d/3d`` (PEFT's layout): ``lora_A`` a conv with the base's kernel, stride and padding
  (``[r, in, *kernel]``), ``lora_B`` a 1x1 conv with the base's groups (``[out, r / groups, 1, ...]``).
  Convolutions are never TP-sharded: under TP they are replicated, like a plain ``nn.Linear``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from nxd.errors import ConfigError
from nxd_core_parallel.dtensor import whole
from nxd_lora.config import LoraConfig
from nxd_lora.naming import CONV_LAYERS, Slot
from nxd_tensor_parallel.modules.qkv_linear import GQAQKVColumnParallelLinear
from nxd_tensor_parallel.parallel_layers import (
    ColumnParallelLinear,
    ParallelEmbedding,
    RowParallelLinear,
    gather_from_tensor_model_parallel_region,
    reduce_from_tensor_model_parallel_region,
    reduce_scatter_to_sequence_parallel_region,
    scatter_to_tensor_model_parallel_region,
    set_tensor_model_parallel_attributes,
)
from nxd_tensor_parallel.parallel_layers.layers import column_parallel_input, tensor_parallel_group_of
from nxd_tensor_parallel.parallel_layers.mappings import reduce_grad_over_group

_CONV_FN = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}


#: the kind of adapter each base layer gets; the first match wins (subclasses before their bases)
_LAYER_KINDS: tuple[tuple[type | tuple[type, ...], str], ...] = (
    (CONV_LAYERS, "conv"),
    (ParallelEmbedding, "parallel_embedding"),
    (nn.Embedding, "embedding"),
    (GQAQKVColumnParallelLinear, "qkv"),
    (ColumnParallelLinear, "column"),
    (RowParallelLinear, "row"),
    (nn.Linear, "linear"),
)


def layer_kind(module: nn.Module) -> str:
    for classes, kind in _LAYER_KINDS:
        if isinstance(module, classes):
            return kind
    raise TypeError(f"LoRA cannot adapt {type(module).__name__}")


def check_conv(base: nn.Module, rank: int, name: str = "") -> None:
    """Refuse the convolutions whose PEFT adapter would not describe a weight update of the base."""
    what = f"{name} ({type(base).__name__})" if name else type(base).__name__
    if rank % base.groups:
        raise ValueError(f"LoRA on {what} with groups={base.groups} needs lora_rank divisible by groups "
                         f"(PEFT's rule), got {rank}")
    if any(d != 1 for d in base.dilation) and any(k != 1 for k in base.kernel_size):
        raise ValueError(f"LoRA on {what} with dilation={base.dilation}: PEFT's lora_A is undilated, so its output "
                         "does not line up with the base's; nxd-lora adapts undilated convolutions only")
    if base.padding_mode != "zeros":
        raise ValueError(f"LoRA on {what} with padding_mode={base.padding_mode!r}: PEFT's lora_A pads with zeros, "
                         "so its update is not the merged weight's; nxd-lora adapts padding_mode='zeros' only")


def check_embedding(base: nn.Module, name: str = "") -> None:
    """Refuse the embedding layouts whose adapter this module does not compute."""
    what = f"{name} ({type(base).__name__})" if name else type(base).__name__
    if isinstance(base, ParallelEmbedding) and (base.shard_across_embedding or not base.collect_output):
        raise ConfigError(f"LoRA on {what}: only vocabulary-parallel tables that reduce their output are adapted "
                          "(shard_across_embedding=False, collect_output=True)")
    if getattr(base, "max_norm", None) is not None or getattr(base, "sparse", False):
        raise ConfigError(f"LoRA on {what} with max_norm or sparse=True is not supported; leave it out of "
                          "target_modules")


class LoraPiece(nn.Module):
    """``lora_A`` ``[r, in (local)]`` and ``lora_B`` ``[out (local), r]`` for one HF module; for a
    convolution ``[r, in, *kernel]`` and ``[out, r / groups, 1, ...]`` (PEFT's conv layout); for an
    embedding ``in`` is the vocabulary and ``out`` the embedding size (PEFT's ``lora_embedding_A/B``)."""

    def __init__(self, slot: Slot, in_full: int, in_local: int, out_local: int, config: LoraConfig,
                 dtype: torch.dtype, device: torch.device | None, generator: torch.Generator | None = None,
                 kernel: tuple[int, ...] = (), groups: int = 1, embedding: bool = False) -> None:
        super().__init__()
        self.slot = slot
        self.embedding = embedding
        r = config.lora_rank
        self.lora_A = nn.Parameter(torch.empty(r, in_local, *kernel, dtype=dtype, device=device))
        self.lora_B = nn.Parameter(torch.zeros(out_local, r // groups, *(1,) * len(kernel), dtype=dtype,
                                               device=device))
        self.groups = groups
        self.dropout = nn.Dropout(config.lora_dropout) if config.lora_dropout > 0 else nn.Identity()  # PEFT's layout
        if not self.lora_A.is_meta:
            self.reset_parameters(config.init_lora_weights, in_full, generator)

    @torch.no_grad()
    def reset_parameters(self, init: str, in_full: int, generator: torch.Generator | None = None) -> None:
        """Initialise the full A and keep this rank's columns, so one seed gives the same adapter
        at any TP size; B starts at zero (PEFT's defaults). ``generator`` must be in the same state
        on every rank (see :func:`nxd_lora.model.shared_init_generator`): a replicated A that
        differed between TP or DP ranks would train a model no export can describe."""
        if self.embedding:  # PEFT's rule for embeddings: A zero, B as nn.Embedding's default N(0, 1)
            self.lora_A.zero_()
            full_b = torch.empty(self.lora_B.shape, dtype=torch.float32)
            self.lora_B.copy_(nn.init.normal_(full_b, generator=generator).to(self.lora_B.dtype))
            return
        full = torch.empty(self.lora_A.shape[0], in_full, *self.lora_A.shape[2:], dtype=torch.float32)
        if init == "gaussian":
            nn.init.normal_(full, std=1.0 / self.lora_A.shape[0], generator=generator)
        else:
            nn.init.kaiming_uniform_(full, a=math.sqrt(5), generator=generator)
        if self.slot.dim == 1:
            full = full[:, list(self.slot.index)]
        self.lora_A.copy_(full.to(self.lora_A.dtype))
        self.lora_B.zero_()

    def delta_weight(self, scaling: float) -> torch.Tensor:
        """``scale * B @ A``: this rank's piece of the weight update (for a convolution, B's 1x1
        kernel composed with A's kernel: ``[out, in, *kernel]``)."""
        if self.groups > 1:
            raise ValueError("merging LoRA into a grouped convolution (groups > 1) is not supported (nor by PEFT); "
                             "keep the adapter unmerged")
        a, b = whole(self.lora_A).float(), whole(self.lora_B).float()  # FSDP: gathered from the DP shards
        return (b.flatten(1) @ a.flatten(1)).view(b.shape[0], *a.shape[1:]) * scaling


class LoraAdapter(nn.Module):
    """The adapters of one base layer; ``pieces`` maps HF short names to :class:`LoraPiece`."""

    def __init__(self, base: nn.Module, slots: list[Slot], targeted: list[bool], config: LoraConfig,
                 generator: torch.Generator | None = None) -> None:
        super().__init__()
        self.kind = layer_kind(base)
        self.scaling = config.scaling
        self.dropout_p = config.lora_dropout
        self.merged = False
        self.disabled = False
        self.slots = slots
        self.targeted = targeted
        weight = _first_weight(base)
        dtype, device = weight.dtype, weight.device
        self.out_sizes = self._local_out_sizes(base, slots)
        in_full, in_local = _in_sizes(base, self.kind)
        self.pieces = nn.ModuleDict()
        sp = bool(getattr(base, "sequence_parallel_enabled", False))
        multiplier = getattr(base, "kv_size_multiplier", 1)
        conv = {}
        if self.kind == "conv":
            check_conv(base, config.lora_rank, slots[0].hf_module)
            conv = dict(kernel=tuple(base.kernel_size), groups=base.groups)
        if self.kind in ("embedding", "parallel_embedding"):
            check_embedding(base, slots[0].hf_module)
            conv = dict(embedding=True)
        for i, (slot, on) in enumerate(zip(slots, targeted)):
            if not on:
                continue
            piece = LoraPiece(slot, in_full, in_local, self.out_sizes[i], config, dtype, device, generator, **conv)
            _tag(piece, self.kind, slot, sp, kv=self.kind == "qkv" and i > 0 and multiplier > 1, multiplier=multiplier)
            if slot.short_name in self.pieces:
                raise ValueError(f"two projections of one layer map to the same HF name {slot.short_name!r}")
            self.pieces[slot.short_name] = piece

    @staticmethod
    def _local_out_sizes(base: nn.Module, slots: list[Slot]) -> list[int]:
        if isinstance(base, GQAQKVColumnParallelLinear):
            sizes = [base.q_local, base.kv_local, base.kv_local]
        elif isinstance(base, (nn.Embedding, ParallelEmbedding)):
            sizes = [base.embedding_dim]
        elif isinstance(base, ColumnParallelLinear):
            local = base.weight.shape[0]
            sizes = [len(s.index) if s.dim == 0 else local // len(slots) for s in slots]
        else:
            sizes = [base.weight.shape[0]] * len(slots)
        if len(sizes) != len(slots) or (len(slots) > 1 and sum(sizes) != _local_rows(base)):
            raise ValueError(f"layout of {type(base).__name__} does not match its weight: slots "
                             f"{[s.hf_module for s in slots]} with local sizes {sizes}")
        return sizes

    def _piece_list(self) -> list[LoraPiece | None]:
        return [self.pieces[s.short_name] if on else None for s, on in zip(self.slots, self.targeted)]

    def _h(self, pieces: list[LoraPiece], x: torch.Tensor) -> torch.Tensor:
        """``x A^T`` for ``pieces`` side by side (``[..., n * r]``). Without dropout the A's are
        stacked for one matmul; with dropout each piece gets its own mask, as in PEFT."""
        if self.dropout_p > 0:
            hs = [F.linear(p.dropout(x), p.lora_A) for p in pieces]
            return torch.cat(hs, dim=-1) if len(hs) > 1 else hs[0]
        a = torch.cat([p.lora_A for p in pieces]) if len(pieces) > 1 else pieces[0].lora_A
        return F.linear(x, a)

    def _add(self, out: torch.Tensor, h: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """``out + scale * h B^T`` in one addmm (no separate scale and add kernels)."""
        shape = (*out.shape[:-1], b.shape[0])
        return torch.addmm(out.reshape(-1, b.shape[0]), h.reshape(-1, h.shape[-1]), b.t(),
                           alpha=self.scaling).view(shape)

    def _delta(self, h: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return F.linear(h, b) * self.scaling

    def _column_h(self, base: nn.Module, active: list[LoraPiece], x: torch.Tensor) -> torch.Tensor:
        """Every rank computes h from the replicated (or sequence-sharded) input."""
        return column_parallel_input(self._h(active, x), base, tensor_parallel_group_of(base))

    def apply(self, base: nn.Module, x: torch.Tensor, output: object) -> object:
        """The base layer's output with the LoRA update added."""
        if self.merged or self.disabled or not len(self.pieces):
            return output
        if self.kind == "qkv":
            return self._apply_qkv(base, x, output)
        main, rest = (output[0], output[1:]) if isinstance(output, tuple) else (output, None)
        pieces = self._piece_list()
        if self.kind in ("embedding", "parallel_embedding"):
            main = self._add(main, self._embedding_h(base, pieces[0], x), pieces[0].lora_B)
        elif self.kind == "conv":
            p, conv = pieces[0], _CONV_FN[len(base.kernel_size)]
            h = conv(p.dropout(x), p.lora_A, stride=base.stride, padding=base.padding)
            main = main + conv(h, p.lora_B, groups=base.groups) * self.scaling
        elif self.kind == "linear":
            main = self._add(main, self._h(pieces, x), pieces[0].lora_B)
        elif self.kind == "row":
            group = tensor_parallel_group_of(base)
            if not base.input_is_parallel:
                x = scatter_to_tensor_model_parallel_region(x, process_group=group)
            h = self._h(pieces, x)
            if base.sequence_parallel_enabled:
                h = reduce_scatter_to_sequence_parallel_region(h, base.sequence_dimension, process_group=group)
            else:
                h = reduce_from_tensor_model_parallel_region(h, process_group=group)
            main = self._add(main, h, pieces[0].lora_B)
        else:
            # fused column base (gate/up): one block-diagonal B maps [h_gate, h_up] onto the fused
            # rows; an untargeted projection is a zero-width block (its rows get no update)
            active = [p for p in pieces if p is not None]
            h = self._column_h(base, active, x)
            if len(pieces) == 1:
                b = pieces[0].lora_B
            else:
                b = torch.block_diag(*[p.lora_B if p is not None else main.new_zeros(size, 0)
                                       for p, size in zip(pieces, self.out_sizes)])
            if base.gather_output:
                main = main + gather_from_tensor_model_parallel_region(self._delta(h, b),
                                                                       process_group=tensor_parallel_group_of(base))
            else:
                main = self._add(main, h, b)
        return (main, *rest) if rest is not None else main

    def _embedding_h(self, base: nn.Module, piece: LoraPiece, ids: torch.Tensor) -> torch.Tensor:
        """``embedding(ids, A^T)`` (PEFT's lookup, with the base's padding_idx and options); a
        vocabulary-parallel table looks up its own ids and reduces like its output."""
        if self.kind == "embedding":
            return F.embedding(ids, piece.lora_A.t(), base.padding_idx, None, base.norm_type, base.scale_grad_by_freq)
        outside = (ids < base.vocab_start_index) | (ids >= base.vocab_end_index)
        local_ids = (ids - base.vocab_start_index).masked_fill(outside, 0)
        pad = base.padding_idx
        local_pad = pad - base.vocab_start_index if pad is not None and base.vocab_start_index <= pad < \
            base.vocab_end_index else None
        h = F.embedding(local_ids, piece.lora_A.t(), local_pad, None, base.norm_type, base.scale_grad_by_freq)
        h = h.masked_fill(outside.unsqueeze(-1), 0.0)
        group = tensor_parallel_group_of(base)
        if base.sequence_parallel_enabled:
            h, dim = base.sequence_layout(h)
            return reduce_scatter_to_sequence_parallel_region(h, dim, process_group=group)
        return reduce_from_tensor_model_parallel_region(h, process_group=group)

    def _apply_qkv(self, base: GQAQKVColumnParallelLinear, x: torch.Tensor, output: tuple) -> tuple:
        pieces = self._piece_list()
        active = [p for p in pieces if p is not None]
        hs = self._column_h(base, active, x)
        hs = list(hs.split([p.lora_A.shape[0] for p in active], dim=-1)) if len(active) > 1 else [hs]
        out = list(output)
        for i, p in enumerate(pieces):
            if p is None:
                continue
            b = p.lora_B
            if i > 0 and base.kv_size_multiplier > 1:
                b = reduce_grad_over_group(b, base.parallel_context.kv_shared_dim(base.kv_size_multiplier).group)
            h = hs.pop(0)
            if base.gather_output:
                out[i] = out[i] + _gather_qkv(self._delta(h, b), i, base)
            else:
                out[i] = self._add(out[i], h, b)
        return tuple(out)

    # ------------------------------------------------------------------ merging
    def weight_params(self, base: nn.Module) -> list[tuple[str, torch.Tensor, list[int]]]:
        """``(param name, weight, indices of slots stored in it)`` in output order."""
        if isinstance(base, GQAQKVColumnParallelLinear) and not base.fuse_qkv:
            return [(f"weight_{n}", getattr(base, f"weight_{n}"), [i]) for i, n in enumerate("qkv")]
        if isinstance(base, GQAQKVColumnParallelLinear):
            return [("weight_qkv", base.weight_qkv, [0, 1, 2])]
        return [("weight", base.weight, list(range(len(self.slots))))]

    @torch.no_grad()
    def merged_weights(self, base: nn.Module) -> dict[str, torch.Tensor]:
        """Base weights with the update added (new tensors; the base is not changed)."""
        out = {}
        pieces = self._piece_list()
        for name, weight, idx in self.weight_params(base):
            new = whole(weight).detach().float().clone()
            row = 0
            for i in idx:
                size = self.out_sizes[i] if self.kind in ("column", "qkv") else weight.shape[0]
                if pieces[i] is not None and pieces[i].embedding:  # PEFT: (B A)^T for a [vocab, dim] table
                    new += pieces[i].delta_weight(self.scaling).t()
                elif pieces[i] is not None:
                    new[row:row + size] += pieces[i].delta_weight(self.scaling)
                row += size if self.kind in ("column", "qkv") else 0
            out[name] = new.to(weight.dtype)
        return out


def _gather_qkv(delta: torch.Tensor, i: int, base: GQAQKVColumnParallelLinear) -> torch.Tensor:
    full = gather_from_tensor_model_parallel_region(delta, process_group=tensor_parallel_group_of(base))
    return full if i == 0 else base.unique_kv(full)  # K/V: one copy of each replicated piece


def _first_weight(base: nn.Module) -> torch.Tensor:
    if isinstance(base, GQAQKVColumnParallelLinear):
        return base.weight_qkv if base.fuse_qkv else base.weight_q
    return base.weight


def _local_rows(base: nn.Module) -> int:
    if isinstance(base, GQAQKVColumnParallelLinear):
        return base.q_local + 2 * base.kv_local
    return base.weight.shape[0]


def _in_sizes(base: nn.Module, kind: str) -> tuple[int, int]:
    if kind == "conv":
        return base.in_channels, base.in_channels
    if kind == "linear":
        return base.in_features, base.in_features
    if kind in ("embedding", "parallel_embedding"):
        return base.num_embeddings, base.weight.shape[0]
    if kind == "row":
        return base.input_size, base.weight.shape[1]
    return base.input_size, base.input_size


def _tag(piece: LoraPiece, kind: str, slot: Slot, sp: bool, kv: bool, multiplier: int) -> None:
    """Parameter attributes that checkpoint resharding, grad clipping and SP grad sync read."""
    a, b = piece.lora_A, piece.lora_B
    sharded_b = kind in ("column", "qkv") and slot.dim == 0
    sharded_a = kind in ("row", "parallel_embedding") and slot.dim == 1
    set_tensor_model_parallel_attributes(a, sharded_a, 1 if sharded_a else -1, 1)
    set_tensor_model_parallel_attributes(b, sharded_b, 0 if sharded_b else -1, 1)
    if kv:
        b.kv_size_multiplier = multiplier
    if sp and kind in ("column", "qkv"):
        a.sequence_parallel_enabled = True  # h is computed on a sequence shard: dA is partial per rank
    if sp and kind in ("row", "parallel_embedding"):
        b.sequence_parallel_enabled = True  # B sees only this rank's sequence shard of h
