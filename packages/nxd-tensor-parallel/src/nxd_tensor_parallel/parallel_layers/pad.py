"""Attention-head padding (NxD's ``pad_model``): run a head count not divisible by the TP size.

NxD's recipe: the attention module sizes its local heads as
``divide(n_heads + get_number_of_extra_heads(n_heads, tp), tp)``, and after building the model
``pad_model(model, tp, n_heads)`` grows the sharded dimension of every ``ColumnParallelLinear`` /
``RowParallelLinear`` in scope by ``n_heads_padded / n_heads``.

nxd pads the *full* (gathered) weight at its end with zero heads and re-shards it, so every rank
holds whole heads: the real heads keep their weights, the padded ones are zero, produce zero
attention output (their V rows are zero) and meet zero output-projection columns, so the padded
model computes exactly what the unpadded one does and the padding never receives gradient. The
weights are marked like ``pad=True`` layers (``mark_padding``): gathered outputs are cut back and
checkpoints hold the real size.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from nxd.errors import ConfigError
from nxd.parallel import ParallelContext, dim_size, resolve_context
from nxd_tensor_parallel.modules.grouped_qkv import GroupedQKVColumnParallelLinear
from nxd_tensor_parallel.modules.qkv_linear import GQAQKVColumnParallelLinear
from nxd_tensor_parallel.parallel_layers import comm
from nxd_tensor_parallel.parallel_layers.layers import (
    ColumnParallelLinear,
    ParallelEmbedding,
    RowParallelLinear,
    shard_of,
    tensor_parallel_group_of,
)
from nxd_tensor_parallel.parallel_layers.utils import copy_tensor_model_parallel_attributes, mark_padding

__all__ = ["generate_padding_mask", "get_number_of_extra_heads", "pad_model", "pad_model_from_config"]

PadHook = Callable[[nn.Module, float], Any]


def get_number_of_extra_heads(n_head: int, tp_degree: int) -> int:
    """Zero heads appended so ``n_head`` splits evenly over ``tp_degree`` ranks (NxD's rule)."""
    return -int(n_head) % int(tp_degree)


def _tp_of(layer: nn.Module) -> tuple[int, int, Any]:
    """TP size, rank and group of a layer (its own group, else its context's)."""
    group = tensor_parallel_group_of(layer)
    if group is None:
        return 1, 0, None
    return comm.group_size(group), comm.group_rank(group), group


def _repad(param: torch.Tensor, dim: int, n_heads: int, n_padded: int, name: str,
           tp: int, rank: int, group: Any) -> tuple[nn.Parameter, int, int]:
    """``param`` (this rank's shard along ``dim``) re-sharded from the full tensor with zero heads
    appended; returns (new parameter, real full size, padded full size)."""
    if getattr(param, "unpadded_size", None) is not None or getattr(param, "partition_stride", 1) != 1:
        raise ValueError(f"pad_model: {name} is already padded (pad=True) or interleaved (stride != 1); "
                         "head padding needs a plain head-major sharded weight")
    full = comm.all_gather(param.detach(), dim, group) if tp > 1 else param.detach()
    real = full.size(dim)
    padded = real // n_heads * n_padded
    widths = [0, 0] * (full.dim() - 1 - dim) + [0, padded - real]
    shard = shard_of(F.pad(full, widths), dim, 1, rank, tp).clone()
    new = nn.Parameter(shard, requires_grad=param.requires_grad)
    copy_tensor_model_parallel_attributes(new, param)
    mark_padding(new, real, real // n_heads)
    return new, real, padded


def _pad_column(layer: ColumnParallelLinear, n_heads: int, n_padded: int, name: str) -> None:
    tp, rank, group = _tp_of(layer)
    layer.weight, real, padded = _repad(layer.weight, 0, n_heads, n_padded, f"{name}.weight", tp, rank, group)
    if layer.bias is not None:
        layer.bias, _, _ = _repad(layer.bias, 0, n_heads, n_padded, f"{name}.bias", tp, rank, group)
    # the state of a pad=True layer: gathered outputs are cut back to the real size
    layer.pad, layer.pad_size, layer.output_size_per_partition = True, padded - real, padded // tp


def _pad_row(layer: RowParallelLinear, n_heads: int, n_padded: int, name: str) -> None:
    tp, rank, group = _tp_of(layer)
    layer.weight, real, padded = _repad(layer.weight, 1, n_heads, n_padded, f"{name}.weight", tp, rank, group)
    # the bias is not sharded; a non-parallel input is padded before the split, as with pad=True
    layer.pad, layer.pad_size, layer.input_size_per_partition = True, padded - real, padded // tp


def pad_model(model: nn.Module, tp_degree: int, n_heads: int, wrapped_classes: Iterable[type] = (),
              pad_hook_fn: PadHook | None = None) -> nn.Module:
    """Pad ``model``'s attention heads from ``n_heads`` to the next multiple of ``tp_degree``
    (NxD's signature); returns ``model``, modified in place.

    Every ``ColumnParallelLinear`` (output dimension) and ``RowParallelLinear`` (input dimension) in
    scope grows by ``n_heads_padded / n_heads``: the whole model, or only the subtrees rooted at
    instances of ``wrapped_classes`` (recommended: the attention class). Left as they are: a layer
    whose sharded size is not a multiple of ``n_heads`` (it holds no per-head slices) and an LM head
    (a ``ColumnParallelLinear`` as wide as the vocabulary: ``model.config.vocab_size`` or a
    ``ParallelEmbedding``'s ``num_embeddings``), whose zero logits would enter the softmax. Other
    layers in scope (an MLP) gain zero units, which changes nothing they compute.
    ``pad_hook_fn(module, tgt_src_ratio)`` is called on every module in scope (children first),
    e.g. to rescale a ``split_size`` field.
    """
    if isinstance(n_heads, bool) or not isinstance(n_heads, int) or n_heads < 1:
        raise ValueError(f"pad_model: n_heads must be a positive int, got {n_heads!r}")
    if isinstance(tp_degree, bool) or not isinstance(tp_degree, int) or tp_degree < 1:
        raise ValueError(f"pad_model: tp_degree must be a positive int, got {tp_degree!r}")
    wrapped = tuple(wrapped_classes)
    n_padded = n_heads + get_number_of_extra_heads(n_heads, tp_degree)
    ratio = n_padded / n_heads
    vocab_sizes = {m.num_embeddings for m in model.modules() if isinstance(m, ParallelEmbedding)}
    vocab_sizes.add(getattr(getattr(model, "config", None), "vocab_size", None))

    def visit(module: nn.Module, name: str, in_scope: bool) -> None:
        for child_name, child in module.named_children():
            visit(child, f"{name}.{child_name}" if name else child_name, in_scope or isinstance(child, wrapped))
        if not in_scope:
            return
        if pad_hook_fn is not None:
            pad_hook_fn(module, ratio)
        if n_padded == n_heads:
            return
        if getattr(module, "padded_heads", False):
            return  # its heads were padded by the model's parallel plan already
        if isinstance(module, GroupedQKVColumnParallelLinear):
            raise ValueError(f"pad_model: {name} is Megatron's interleaved QKV with K/V heads replicated over TP "
                             "(kv_size_multiplier), which head padding does not cover; choose a tensor-parallel size "
                             f"dividing n_heads={n_heads}")
        if isinstance(module, (ColumnParallelLinear, RowParallelLinear)):
            column = isinstance(module, ColumnParallelLinear)
            if (module.output_size if column else module.input_size) % n_heads:
                return  # not a multiple of n_heads: holds no per-head slices, nothing to pad
            if column and module.output_size in vocab_sizes:
                return  # an LM head: padded logits would change the softmax
            tp = _tp_of(module)[0]
            if tp != tp_degree:
                raise ValueError(f"pad_model(tp_degree={tp_degree}): {name or 'model'} is sharded over {tp} ranks; "
                                 "pass the tensor-parallel size the model was built with")
            (_pad_column if column else _pad_row)(module, n_heads, n_padded, name or "model")
        elif isinstance(module, GQAQKVColumnParallelLinear):
            raise ValueError(f"pad_model: {name} is a GQAQKVColumnParallelLinear (fused Q/K/V with KV-head "
                             "replication), which head padding does not cover; build the attention from "
                             "ColumnParallelLinear q/k/v projections, or choose a tensor-parallel size dividing "
                             f"n_heads={n_heads}")

    visit(model, "", not wrapped or isinstance(model, wrapped))
    return model


def pad_model_from_config(model: nn.Module, context: ParallelContext | None = None) -> nn.Module:
    """``neuronx_distributed_config(pad_model=True)``: pad ``model`` to the TP size of ``context``
    (the current one when left out) with the head count of its ``config.num_attention_heads`` (NxD
    pads Hugging Face-style models). A model whose class declares ``nxd_pads_attention_heads`` (nxd's
    GPT: its plan pads the attention projections) is left as it is."""
    if getattr(model, "nxd_pads_attention_heads", False):
        return model
    heads = getattr(getattr(model, "config", None), "num_attention_heads", None)
    if isinstance(heads, bool) or not isinstance(heads, int):
        raise ConfigError(f"pad_model=True needs the model's config.num_attention_heads (an int) to know the head "
                          f"count; {type(model).__name__} has none. Call nxd_tensor_parallel.parallel_layers.pad."
                          "pad_model(model, tp_degree, n_heads) in model_fn instead")
    return pad_model(model, dim_size(resolve_context(context), "tp"), heads)


def generate_padding_mask(num_heads: int, num_heads_with_pad: int, num_kv_heads: int, tp_degree: int, tp_rank: int,
                          hardware_type: str | None = None) -> torch.Tensor:
    """NxD's mask of the query heads a TP rank holds (True: real, False: padding) when a GQA model
    pads its query heads to ``num_heads_with_pad`` and multiplies its attention output by the mask.

    ``GQAQKVColumnParallelLinear`` replicates each KV head on adjacent TP ranks
    (``K0, K0, K1, K1, ...``), the layout NxD uses on Trainium2, so the mask is NxD's ``trn2`` one:
    on the ranks holding a KV head's replicas, the query slots past ``num_heads / num_kv_heads`` are
    padding. ``hardware_type``: ``None`` or ``"trn2"``; NxD's ``"trn1"`` mask describes replicas
    grouped round-robin, a layout nxd's layers never have, and is refused.
    """
    kind = None if hardware_type is None else str(getattr(hardware_type, "value", hardware_type)).lower()
    if kind in ("trn1", "trn1n", "inf2"):
        raise ValueError(f"generate_padding_mask(hardware_type={hardware_type!r}): the trn1 mask is for KV heads "
                         "replicated round-robin; nxd's GQAQKVColumnParallelLinear replicates them on adjacent ranks "
                         "(NxD's trn2 layout): pass hardware_type=None")
    if kind not in (None, "trn2"):
        raise RuntimeError(f"Unexpected hardware_type {hardware_type} received in padding mask generation "
                           "(nxd: None or 'trn2')")
    per_rank = num_heads_with_pad // tp_degree
    replicas = max(tp_degree // num_kv_heads, 1)
    kv_per_rank = num_kv_heads * replicas // tp_degree
    low = per_rank * (tp_rank % replicas)
    return torch.arange(low, low + per_rank) < num_heads // num_kv_heads * kv_per_rank
