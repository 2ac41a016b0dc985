"""Tensor parallelism applied to a plain model in one place (torchtitan's ``parallelize``).

A model built plain (TP=1 shapes, ``nn.Linear``/``nn.Embedding``: Hugging Face's
``LlamaForCausalLM`` from a config, or any model written without nxd's layers) is parallelised by a
:class:`nxd.specs.ParallelPlan`: every module a pattern names is swapped for nxd's parallel layer
holding this rank's shard of the full weight it had, so the parallel model computes what the plain
one did. Styles:

* ``column``: ``nn.Linear`` -> ``ColumnParallelLinear(gather_output=False)`` (output rows sharded);
* ``row``: ``nn.Linear`` -> ``RowParallelLinear(input_is_parallel=True)`` (input columns sharded,
  output summed over TP; the bias stays whole);
* ``vocab``: ``nn.Embedding`` -> ``ParallelEmbedding`` (vocabulary rows sharded);
* ``gathered``: ``nn.Linear`` -> ``ColumnParallelLinear(gather_output=True)`` (an LM head: whole
  logits on every rank, so the model's own loss is unchanged);
* ``scattered``: ``nn.Linear`` -> ``RowParallelLinear(input_is_parallel=False)`` (the whole input
  split on entry, output summed over TP: the partner of a ``gathered`` layer);
* ``partial_grad``: replicated modules fed TP-sharded activations (Qwen3's per-head q/k norms): each
  rank's weight gradient is partial, so it is summed over TP in backward.

A ``column`` ``nn.Linear`` declaring ``kv_size_multiplier`` m (a transformers K/V projection of a
model with fewer K/V heads than TP ranks) holds its K/V piece replicated on m ranks (``_kv_replicated``).

Attention reshapes whose head count follows the projection width (``view(..., -1, head_dim)``, as in
transformers) see this rank's heads; integer head-count attributes of a module whose projections
were sharded (``num_heads``, ``num_key_value_heads``) are divided by the TP size. Sharding by heads
needs the TP size to divide both head counts (the model's ``config``) and is refused otherwise.

The ``parallel_plan`` transform (slot ``parallel_plan``) applies the plan a model carries in
``nxd_parallel_plan`` (nxd's families declare theirs as a class attribute and build plain; set it in
``model_fn`` for any other model; :func:`transformers_plan` reads Hugging Face's own TP plan). It is
the only place nxd's models become tensor parallel: outside the trainer, ``nxd.build_parallel_model``
(or ``nxd.transforms.parallelize_model`` on a built model) runs the same transforms. Modules that are
already parallel (a model written with NxD's layers) are left as they are.
"""

from __future__ import annotations

import fnmatch
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from nxd.errors import ConfigError
from nxd.parallel import ParallelContext, dim_group, dim_rank, dim_size
from nxd.run_config import RunConfig, sequence_parallel_built_for
from nxd.specs import ParallelPlan
from nxd_tensor_parallel.layout_rules import SizeNames, check_vocab, head_layout
from nxd_tensor_parallel.modules.grouped_qkv import GroupedQKVColumnParallelLinear
from nxd_tensor_parallel.modules.kv_heads import HeadPadding
from nxd_tensor_parallel.modules.plain import GroupedQKVLinear, PlacedByPlan, QKVLinear
from nxd_tensor_parallel.modules.qkv_linear import GQAQKVColumnParallelLinear
from nxd_tensor_parallel.parallel_layers import comm
from nxd_tensor_parallel.parallel_layers.layers import (
    ColumnParallelLinear,
    ParallelEmbedding,
    RowParallelLinear,
    shard_of,
)
from nxd_tensor_parallel.parallel_layers.utils import mark_padding

#: the attribute a model carries its plan in (read by the ``parallel_plan`` transform)
PLAN_ATTRIBUTE = "nxd_parallel_plan"

#: Hugging Face's TP plan styles -> ours
HF_STYLES = {"colwise": "column", "rowwise": "row", "colwise_gather_output": "gathered",
              "rowwise_split_input": "scattered", "replicated_with_grad_allreduce": "partial_grad",
              "embedding": "vocab"}

#: the styles that swap a module for a parallel layer
_SWAPPED = ("column", "row", "vocab", "gathered", "scattered")
_PARALLEL_LAYERS = (ColumnParallelLinear, RowParallelLinear, ParallelEmbedding, GQAQKVColumnParallelLinear,
                    GroupedQKVColumnParallelLinear)

#: attention head-count attributes divided by the TP size when the module's projections are sharded
_HEAD_COUNTS = ("num_heads", "num_attention_heads", "num_key_value_heads")


def _skip_init(weight: torch.Tensor) -> None:
    """The parallel layers' init is replaced by the plain weight's shard."""


def _check_divisible(name: str, what: str, size: int, tp: int) -> None:
    if size % tp:
        raise ConfigError(f"parallel plan: {name}'s {what} ({size}) is not divisible by tensor_parallel_size ({tp}); "
                          "choose a tensor_parallel_size that divides it")


def _copy_shard(param: torch.Tensor, full: torch.Tensor, dim: int, context: ParallelContext | None,
                stride: int = 1, pad: int = 0) -> None:
    """``param`` <- this rank's shard of ``full`` (``pad`` zero entries appended along ``dim`` first)."""
    if param.is_meta or full.is_meta:  # a model built on meta is materialised later (reset_parameters)
        return
    full = full.detach()
    if pad:
        full = F.pad(full, [0, 0] * (full.dim() - 1 - dim) + [0, pad])
    with torch.no_grad():
        param.copy_(shard_of(full, dim, stride, dim_rank(context, "tp"), dim_size(context, "tp")))


def _keep_init(layer: nn.Module, module: nn.Module) -> nn.Module:
    """The parallel layer re-initialises as the plain module did (a model built on meta is
    materialised by ``reset_parameters`` after the swap); a module without ``init_method`` (a
    transformers ``nn.Linear``) keeps its copied weights only."""
    if getattr(module, "init_method", None) is not None:
        layer.init_method = module.init_method
    return layer


def _head_padding(module: nn.Module, options: dict, tp: int) -> tuple[HeadPadding, int] | None:
    """``(padded layout, head_dim)`` of a ``padded`` module declaring ``attention_heads = (query
    heads, KV heads, head_dim)`` (Llama's ``qkv_proj``/``o_proj``) whose query heads TP does not
    divide; else None."""
    heads = getattr(module, "attention_heads", None)
    if not options.get("pad") or heads is None:
        return None
    layout = head_layout(heads[0], heads[1], tp, pad=True)
    return None if layout.padding is None else (layout.padding, heads[2])


def _tag_head_padding(layer: nn.Module, params: list, padding: HeadPadding, head_dim: int) -> None:
    """Checkpoints and exports hold the real heads (nxd-ckpt reads ``head_padding``)."""
    for param in params:
        if param is not None:
            param.head_padding = (padding.num_heads, padding.num_kv_heads, padding.group_slots, padding.kv_groups,
                                  head_dim)
    layer.padded_heads = True  # pad_model leaves it alone


def _padded_heads(name: str, module: nn.Linear, style: str, context: ParallelContext | None,
                  options: dict) -> nn.Module | None:
    """NxD's ``pad_model`` as plan data: a ``padded`` projection whose query heads TP does not
    divide is sharded from its full weight with zero heads added, so every rank holds whole heads.
    Two layouts: a module declaring ``pad_heads = (query heads, rows of one query group along its
    sharded dimension)`` (GPT's interleaved groups) gets zero groups appended, marked like
    ``pad=True`` weights; an output projection declaring ``attention_heads`` (Llama's ``o_proj``)
    gets the columns of :class:`~nxd_tensor_parallel.modules.kv_heads.HeadPadding`'s zero heads,
    tagged ``head_padding`` (its ``qkv_proj``: :func:`_qkv`). Zero heads give zero attention output
    into zero output-projection columns (the model computes what it did unpadded, the padding gets
    no gradient); checkpoints and exports hold the real size. None when no padding is needed."""
    tp = dim_size(context, "tp")
    dim = 1 if style == "row" else 0
    real = module.weight.shape[dim]
    grouped = _head_padding(module, options, tp) if style == "row" else None
    heads, unit = getattr(module, "pad_heads", (None, None))
    if grouped is not None:
        padding, head_dim = grouped
        padded = padding.size(head_dim, kv=False)

        def widen(full: torch.Tensor) -> torch.Tensor:
            return padding.pad(full, dim, head_dim, kv=False)
    elif options.get("pad") and heads is not None and heads % tp:
        padded = -(-real // (unit * tp)) * unit * tp

        def widen(full: torch.Tensor) -> torch.Tensor:
            return F.pad(full, [0, 0] * (full.dim() - 1 - dim) + [0, padded - real])
    else:
        return None
    weight, bias = module.weight, module.bias
    common = dict(bias=bias is not None, dtype=weight.dtype, device=weight.device, init_method=_skip_init,
                  context=context, **{k: v for k, v in options.items() if k != "pad"})
    if style == "row":
        layer = RowParallelLinear(padded, module.out_features, input_is_parallel=True, **common)
        sharded = [(layer.weight, weight)]
        if bias is not None and not (bias.is_meta or layer.bias.is_meta):
            with torch.no_grad():
                layer.bias.copy_(bias)  # a row layer's bias is whole
    else:
        layer = ColumnParallelLinear(module.in_features, padded, gather_output=False, **common)
        sharded = [(p, full) for p, full in ((layer.weight, weight), (layer.bias, bias)) if full is not None]
    for param, full in sharded:
        if not full.is_meta:
            _copy_shard(param, widen(full.detach()), dim if param.dim() > 1 else 0, context)
    if grouped is not None:
        _tag_head_padding(layer, [param for param, _ in sharded], *grouped)
        return _keep_init(layer, module)
    for param, _ in sharded:
        mark_padding(param, real, unit)
    if style == "row":
        layer.input_size = real
    else:
        layer.output_size = real
    layer.pad, layer.pad_size, layer.padded_heads = True, padded - real, True
    return _keep_init(layer, module)


def _kv_replicated(name: str, module: nn.Linear, m: int, context: ParallelContext | None, common: dict) -> nn.Module:
    """A plain K or V projection declaring ``kv_size_multiplier`` m (its model has fewer K/V heads
    than TP ranks) -> ``ColumnParallelLinear`` holding piece ``rank // m`` of ``tp // m``, the same
    piece on m neighbouring ranks (:mod:`~nxd_tensor_parallel.modules.kv_heads`' layout, as
    ``GQAQKVColumnParallelLinear`` holds it). Weight and bias are tagged ``kv_size_multiplier`` (the
    checkpoint, the gradient norm and ``nxd plan`` count one copy) and their gradients are summed
    over the ranks sharing the piece (each computes only its own query heads' part)."""
    tp, rank = dim_size(context, "tp"), dim_rank(context, "tp")
    if tp % m or (module.out_features * m) % tp:
        raise ConfigError(f"parallel plan: {name} declares kv_size_multiplier={m}, which does not place its "
                          f"{module.out_features} output rows over tensor_parallel_size {tp}")
    layer = ColumnParallelLinear(module.in_features, module.out_features * m, gather_output=False, **common)
    local, group = layer.output_size_per_partition, context.kv_shared_dim(m).group
    for param, full in ((layer.weight, module.weight), (layer.bias, module.bias)):
        if full is None:
            continue
        if not (param.is_meta or full.is_meta):
            with torch.no_grad():
                param.copy_(full.detach().narrow(0, (rank // m) * local, local))
        param.kv_size_multiplier = m
        param.register_hook(lambda grad: comm.all_reduce(grad.clone(), group))
    layer.kv_size_multiplier = m
    return _keep_init(layer, module)


def _linear(name: str, module: nn.Module, style: str, context: ParallelContext | None, options: dict) -> nn.Module:
    padded = _padded_heads(name, module, style, context, options) if isinstance(module, nn.Linear) and \
        style != "scattered" else None
    if padded is not None:
        return padded
    if not isinstance(module, nn.Linear):
        raise ConfigError(f"parallel plan: {name} is named {style} but is a {type(module).__name__}; "
                          f"{style} shards an nn.Linear")
    tp = dim_size(context, "tp")
    weight, bias = module.weight, module.bias
    common = dict(bias=bias is not None, dtype=weight.dtype, device=weight.device, init_method=_skip_init,
                  context=context, **options)
    if style in ("row", "scattered"):
        if not options.get("pad"):
            _check_divisible(name, "in_features", module.in_features, tp)
        layer = RowParallelLinear(module.in_features, module.out_features, input_is_parallel=style == "row", **common)
        _copy_shard(layer.weight, weight, 1, context, pad=layer.pad_size)
        if bias is not None and not (bias.is_meta or layer.bias.is_meta):
            with torch.no_grad():
                layer.bias.copy_(bias)
        return _keep_init(layer, module)
    replicas = int(getattr(module, "kv_size_multiplier", 1) or 1)
    if replicas > 1 and style == "column":
        return _kv_replicated(name, module, replicas, context, common)
    pieces = getattr(module, "fused_pieces", 1)
    if not options.get("pad"):
        _check_divisible(name, "out_features" if pieces == 1 else f"out_features / {pieces} fused pieces",
                         module.out_features // pieces, tp)
    layer = ColumnParallelLinear(module.in_features, module.out_features, gather_output=style == "gathered",
                                 stride=pieces, **common, **_pad_alignment(module, options))
    for param, full in ((layer.weight, weight), (layer.bias, bias)):
        if full is not None:
            _copy_shard(param, full, 0, context, stride=pieces, pad=layer.pad_size)
            if pieces > 1:  # the local shard is [piece_0 | piece_1 | ...], each contiguous (docs/parallel.md)
                param.fused_splits = (layer.output_size_per_partition // pieces,) * pieces
                param.partition_stride = 1
    return _keep_init(layer, module)


def _qkv(name: str, module: QKVLinear, context: ParallelContext | None, options: dict) -> nn.Module:
    """A one-device fused QKV projection -> ``GQAQKVColumnParallelLinear`` with the family's K/V
    replication at this TP size (``module.kv_size_multiplier_for``); named ``padded`` and declaring
    ``attention_heads`` with query heads TP does not divide, its heads are padded
    (:class:`~nxd_tensor_parallel.modules.kv_heads.HeadPadding`: zero query heads inside the KV groups,
    zero groups) and tagged ``head_padding``."""
    tp = dim_size(context, "tp")
    grouped = _head_padding(module, options, tp)
    options = {k: v for k, v in options.items() if k != "pad"}
    bias = module.bias_qkv
    if grouped is not None:  # query heads padded inside their KV groups (and zero groups), NxD's pad_model
        padding, head_dim = grouped
        q_size, kv_size, m = padding.padded_heads * head_dim, padding.kv_groups * head_dim, padding.kv_size_multiplier(tp)
    else:
        q_size, kv_size, m = module.q_size, module.kv_size, module.kv_size_multiplier_for(tp)
    layer = GQAQKVColumnParallelLinear(
        module.input_size, [q_size, kv_size], bias=bias is not None, gather_output=False,
        dtype=module.weight_qkv.dtype, device=module.weight_qkv.device, init_method=_skip_init,
        kv_size_multiplier=m, fuse_qkv=True, context=context, **options)
    if grouped is not None:
        _tag_head_padding(layer, [layer.weight_qkv, layer.bias_qkv], *grouped)
    if not module.weight_qkv.is_meta:
        with torch.no_grad():
            for param, full in ((layer.weight_qkv, module.weight_qkv), (layer.bias_qkv, bias)):
                if full is None:
                    continue
                full = full.detach()
                if grouped is not None:
                    full = grouped[0].pad(full, 0, grouped[1], kv=True)
                param.copy_(torch.cat(layer.local_pieces(list(full.split([q_size, kv_size, kv_size])))))
    return _keep_init(layer, module)


def _grouped_qkv(name: str, module: GroupedQKVLinear, context: ParallelContext | None,
                 options: dict) -> nn.Module:
    """Megatron's interleaved QKV: whole query groups per rank when TP divides them, else K/V
    replicated over TP (``kv_size_multiplier``, :mod:`nxd_tensor_parallel.modules.grouped_qkv`)."""
    tp = dim_size(context, "tp")
    if options.get("pad") and module.num_heads % tp:
        return _linear(name, module, "column", context, options)  # whole zero groups appended (pad_heads)
    m = head_layout(module.num_heads, module.num_kv_heads, tp, prefix=f"parallel plan: {name}: ",
                    names=SizeNames(heads="query heads", kv_heads="query groups"),
                    hint="; pad them with pad_model, or choose a tensor_parallel_size dividing them").kv_size_multiplier
    if m == 1:
        return _linear(name, module, "column", context, options)
    weight, bias = module.weight, module.bias
    options = {k: v for k, v in options.items() if k in ("sequence_parallel_enabled", "sequence_dimension",
                                                         "reduce_dtype")}
    layer = GroupedQKVColumnParallelLinear(module.in_features, module.num_heads, module.num_kv_heads, module.head_dim,
                                           m, bias=bias is not None, dtype=weight.dtype, device=weight.device,
                                           init_method=_skip_init, context=context, **options)
    if not weight.is_meta:
        with torch.no_grad():
            layer.weight.copy_(layer.local_of(weight.detach()))
            if bias is not None:
                layer.bias.copy_(layer.local_of(bias.detach()))
    return _keep_init(layer, module)


def _embedding(name: str, module: nn.Module, context: ParallelContext | None, options: dict) -> nn.Module:
    if not isinstance(module, nn.Embedding):
        raise ConfigError(f"parallel plan: {name} is named vocab but is a {type(module).__name__}; vocab shards an "
                          "nn.Embedding (an LM head is 'gathered')")
    if module.max_norm is not None or module.sparse:
        raise ConfigError(f"parallel plan: {name} uses max_norm or sparse gradients, which ParallelEmbedding refuses")
    check_vocab(module.num_embeddings, dim_size(context, "tp"), padded=bool(options.get("pad")), prefix="parallel plan: ",
                names=SizeNames(vocab=f"{name}'s num_embeddings"), hint="; choose a tensor_parallel_size that divides it")
    options = {**options, **_pad_alignment(module, options)}
    layer = ParallelEmbedding(module.num_embeddings, module.embedding_dim, padding_idx=module.padding_idx,
                              scale_grad_by_freq=module.scale_grad_by_freq, init_method=_skip_init,
                              dtype=module.weight.dtype, device=module.weight.device, context=context, **options)
    _copy_shard(layer.weight, module.weight, 0, context, pad=layer.pad_size)
    return _keep_init(layer, module)


def _sum_grad_over_tp(module: nn.Module, context: ParallelContext | None) -> None:
    group = dim_group(context, "tp")
    if group is None or comm.group_size(group) == 1:
        return
    for param in module.parameters(recurse=False):
        param.register_hook(lambda grad: comm.all_reduce(grad.clone(), group))


def _check_heads(model: nn.Module, tp: int) -> None:
    """A plain model's heads split over TP as they are (no K/V replication, no padding)."""
    config = getattr(model, "config", None)
    heads, kv = (getattr(config, field, None) for field in ("num_attention_heads", "num_key_value_heads"))
    if isinstance(heads, int):
        head_layout(heads, kv if isinstance(kv, int) else None, tp, replicate_kv=False, prefix="parallel plan: ",
                    names=SizeNames(heads="config.num_attention_heads", kv_heads="config.num_key_value_heads"),
                    hint=" (nxd's families replicate KV heads; a plain model does not)")


def _layer_options(name: str, style: str, plan: ParallelPlan, sequence_parallel: bool,
                   reduce_dtype: torch.dtype | None) -> dict:
    """Constructor options of the parallel layer for ``name``: sequence parallelism, padding, the
    dtype its TP sums run in (linear layers only: an embedding's sum is exact, one rank holds each row)."""
    options: dict[str, Any] = {}
    if reduce_dtype is not None and style != "vocab":
        options["reduce_dtype"] = reduce_dtype
    whole = any(fnmatch.fnmatchcase(name, p) for p in plan.whole_sequence)
    if sequence_parallel and style not in ("gathered", "scattered") and not whole:
        options.update(sequence_parallel_enabled=True, sequence_dimension=plan.sequence_dimension)
    if any(fnmatch.fnmatchcase(name, p) for p in plan.padded):
        options["pad"] = True
    return options


def _pad_alignment(module: nn.Module, options: dict) -> dict:
    """``{"pad_alignment_size_per_rank": n}`` for a ``padded`` vocabulary layer declaring it
    (Megatron's ``make_vocab_size_divisible_by``: padded to a multiple of ``n`` x TP), else ``{}``."""
    alignment = getattr(module, "pad_alignment_size_per_rank", None)
    return {"pad_alignment_size_per_rank": alignment} if options.get("pad") and alignment else {}


def _lay_out(model: nn.Module, plan: ParallelPlan, context: ParallelContext | None, sequence_parallel: bool) -> None:
    """What a plain build leaves out: the plan's ``sequence`` modules (norms) run on sequence shards,
    so their weights' gradients are partial and summed over TP (``sequence_parallel_enabled``), and
    every :class:`~nxd_tensor_parallel.modules.plain.PlacedByPlan` module learns the context and SP."""
    for _, module in plan.modules(model, "sequence"):
        module.sequence_parallel_enabled = sequence_parallel
        for param in module.parameters(recurse=False):
            param.sequence_parallel_enabled = sequence_parallel
    for module in model.modules():
        if isinstance(module, PlacedByPlan):
            module.parallel_context, module.sequence_parallel = context, sequence_parallel


def _parallel_layer(name: str, module: nn.Module, style: str, context: ParallelContext | None,
                    options: dict) -> nn.Module:
    if style == "vocab":
        return _embedding(name, module, context, options)
    if isinstance(module, QKVLinear):
        if style != "column":
            raise ConfigError(f"parallel plan: {name} is a fused QKV projection, which is column parallel; "
                              f"the plan names it {style}")
        return _qkv(name, module, context, options)
    if isinstance(module, GroupedQKVLinear):
        if style != "column":
            raise ConfigError(f"parallel plan: {name} is a fused QKV projection, which is column parallel; "
                              f"the plan names it {style}")
        return _grouped_qkv(name, module, context, options)
    return _linear(name, module, style, context, options)


def parallelize(model: nn.Module, plan: ParallelPlan, context: ParallelContext | None,
                sequence_parallel: bool = False, reduce_dtype: torch.dtype | None = None) -> nn.Module:
    """Swap the plain modules ``plan`` names for nxd's parallel layers over ``context``'s TP group,
    each holding its shard of the weight it replaces (in place; returns ``model``). Tied weights
    (an embedding and its LM head, both sharded by vocabulary) stay tied. Modules that are already
    parallel are left alone. Modules defining ``nxd_parallelized(context)`` (an attention that
    derives its per-rank head counts) are called after the swap; the others' head-count attributes
    are divided by the TP size. ``sequence_parallel``: the swapped layers run on sequence shards
    (the plan must name the ``sequence`` modules, the norms in between). ``reduce_dtype``: the dtype
    the linear layers sum their TP partial results in (NxD's ``reduce_dtype``; fp32 when ``None``)."""
    if sequence_parallel and not plan.sequence:
        raise ConfigError("parallel plan on a plain model: sequence_parallel is not supported (the plain model's "
                          "norms and residuals run on whole sequences); set sequence_parallel=False or build the "
                          "model with nxd's family layers")
    tp = dim_size(context, "tp")
    derives_heads = any(callable(getattr(m, "nxd_parallelized", None)) for m in model.modules())
    if not derives_heads:
        _check_heads(model, tp)
    new_for_old: dict[int, tuple[str, nn.Parameter]] = {}
    sharded_parents: list[nn.Module] = []
    for name, module in list(model.named_modules()):
        style = plan.style_of(name) if name else None
        if style not in _SWAPPED and style != "partial_grad" or isinstance(module, _PARALLEL_LAYERS):
            continue
        if style == "partial_grad":
            _sum_grad_over_tp(module, context)
            continue
        layer = _parallel_layer(name, module, style, context, _layer_options(name, style, plan, sequence_parallel,
                                                                                 reduce_dtype))
        old = getattr(module, "weight", None)
        if old is None:
            pass
        elif id(old) in new_for_old:  # tied to a module swapped before: share its shard
            first, shard = new_for_old[id(old)]
            if shard.shape != layer.weight.shape:
                raise ConfigError(f"parallel plan: {name} shares its weight with {first}, but the plan shards them "
                                  "differently; name both in the same style")
            layer.weight = shard
        else:
            new_for_old[id(old)] = (name, layer.weight)
        parent_name, _, leaf = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        setattr(parent, leaf, layer)
        if style in ("column", "row"):
            sharded_parents.append(parent)
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) in new_for_old:
            raise ConfigError(f"parallel plan: {name} shares its weight with {new_for_old[id(param)][0]}, which the "
                              "plan shards; name it in the plan too")
    _lay_out(model, plan, context, sequence_parallel)
    for module in model.modules():
        if callable(getattr(module, "nxd_parallelized", None)):
            module.nxd_parallelized(context)
    for parent in {id(m): m for m in sharded_parents}.values():
        if callable(getattr(parent, "nxd_parallelized", None)):
            continue
        for attr in _HEAD_COUNTS:
            value = vars(parent).get(attr)
            if isinstance(value, int) and not isinstance(value, bool):
                setattr(parent, attr, value // tp)
    return model


def transformers_plan(model: nn.Module) -> ParallelPlan:
    """The :class:`ParallelPlan` of a transformers model from its own TP plan (``config.base_model_tp_plan``
    under the base model's prefix, plus the model class's ``_tp_plan``, e.g. ``lm_head``), with the
    token embedding vocabulary-parallel. Raises naming the style nxd does not have."""
    base_prefix = getattr(model, "base_model_prefix", "model")
    entries = {f"{base_prefix}.{k}": v for k, v in (getattr(model.config, "base_model_tp_plan", None) or {}).items()}
    entries.update(getattr(type(model), "_tp_plan", None) or {})
    styles: dict[str, list[str]] = {}
    for pattern, hf_style in entries.items():
        if hf_style not in HF_STYLES:
            raise ConfigError(f"transformers TP plan of {type(model).__name__}: {pattern}: style {hf_style!r} has no "
                              f"nxd equivalent (nxd: {', '.join(HF_STYLES)}); write a ParallelPlan by hand")
        styles.setdefault(HF_STYLES[hf_style], []).append(pattern)
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if isinstance(embeddings, ParallelEmbedding) or (isinstance(embeddings, nn.Embedding)
                                                     and type(embeddings).forward is nn.Embedding.forward):
        styles.setdefault("vocab", []).extend(n for n, m in model.named_modules() if m is embeddings)
    elif embeddings is not None:
        # an embedding computing more than a lookup (Gemma's scaled one) stays whole, and so does an
        # LM head sharing its weight (a sharded head cannot share a whole weight)
        tied = {n for n, m in model.named_modules()
                if m is not embeddings and getattr(m, "weight", None) is getattr(embeddings, "weight", False)}
        styles = {style: [p for p in patterns if p not in tied] for style, patterns in styles.items()}
    return ParallelPlan(**{style: tuple(patterns) for style, patterns in styles.items() if patterns})


def plan_of(model: nn.Module) -> ParallelPlan | None:
    """The plan ``model`` carries (``nxd_parallel_plan``), or ``None``."""
    plan = getattr(model, PLAN_ATTRIBUTE, None)
    if plan is not None and not isinstance(plan, ParallelPlan):
        raise ConfigError(f"{type(model).__name__}.{PLAN_ATTRIBUTE} must be an nxd.specs.ParallelPlan, got "
                          f"{type(plan).__name__}")
    return plan


def is_plain(model: nn.Module) -> bool:
    """``model`` carries a parallel plan that has not been applied: every tensor is whole, whatever
    the sizes of the context it was built for (a family's model inside NxD's ``model_fn``, before
    ``initialize_parallel_model``'s transforms). The plan swaps in parallel layers at any TP size."""
    return plan_of(model) is not None and not any(isinstance(m, _PARALLEL_LAYERS) for m in model.modules())


def _sequence_parallel(model: nn.Module, config: RunConfig) -> bool:
    """Sequence parallelism is the config's; a model whose constructor built it for another setting
    (:func:`nxd.run_config.sequence_parallel_built_for`) is refused. A config silent on SP took the
    model's already (:meth:`nxd.run_config.RunConfig.for_context`); a plain family states none."""
    built_for = sequence_parallel_built_for(model)
    if built_for is not None and config.sequence_parallel != built_for:
        raise ConfigError(f"sequence_parallel={config.sequence_parallel}, but {type(model).__name__} was built with "
                          f"sequence_parallel={built_for}; build it with the config's value (ModelSpec.build reads it)")
    return config.sequence_parallel


def apply_parallel_plan(model: nn.Module, context: ParallelContext | None, config: Any) -> nn.Module | None:
    """The ``parallel_plan`` transform: :func:`parallelize` with the plan the model carries (nothing
    without one), the config's ``parallel_layers_reduce_dtype`` given to every linear layer it makes."""
    plan = plan_of(model)
    if plan is None:
        return None
    config = RunConfig.for_context(config, context, model)  # a partial NxD dict silent on SP: the model's
    return parallelize(model, plan, context, _sequence_parallel(model, config),
                       config.parallel_layers_reduce_dtype)
