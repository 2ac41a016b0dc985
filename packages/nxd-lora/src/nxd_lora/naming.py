"""Where each adapted layer's rows and columns live in the Hugging Face (PEFT) naming.

This is the one place that knows model-specific layouts. For a base weight parameter on TP rank
``r`` a *plan* lists the HF tensors whose rows (``dim=0``) or columns (``dim=1``) make up the local
shard, in local order. LoRA follows the base: for an output-sharded (column) base, lora_B holds
the same rows; for an input-sharded (row) base, lora_A holds the same columns. So the plan
describes both export (gather + place) and import (slice) of adapters.

Models registered with a :class:`nxd.specs.ModelSpec` whose ``extras["model_class"]`` matches
get their layout from the model plugin's ``extras["hf_param_plan"]`` (the llama plugin publishes
one); other models fall back to the generic rule (module names are HF names, Megatron contiguous
shards).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from nxd.parallel import ParallelContext, dim_rank, dim_size
from nxd_tensor_parallel.modules.qkv_linear import GQAQKVColumnParallelLinear
from nxd_tensor_parallel.parallel_layers import ColumnParallelLinear, ParallelEmbedding, RowParallelLinear

#: Convolutions LoRA adapts as PEFT does (never sharded over TP: replicated, like a plain nn.Linear).
CONV_LAYERS: tuple[type, ...] = (nn.Conv1d, nn.Conv2d, nn.Conv3d)

#: Embeddings LoRA adapts as PEFT does (``lora_embedding_A`` ``[r, num_embeddings]``, ``lora_embedding_B``
#: ``[embedding_dim, r]``); a vocabulary-parallel table shards A's columns as it shards its rows.
EMBEDDING_LAYERS: tuple[type, ...] = (nn.Embedding, ParallelEmbedding)

#: The layer classes LoRA knows how to adapt.
SUPPORTED_LAYERS: tuple[type, ...] = (nn.Linear, ColumnParallelLinear, RowParallelLinear, GQAQKVColumnParallelLinear,
                                      *CONV_LAYERS, *EMBEDDING_LAYERS)


@dataclass(frozen=True)
class Slot:
    """One HF module's part of a base layer on one TP rank.

    ``dim``: 0 when the rank holds rows ``index`` of the HF weight (output-sharded), 1 when it holds
    columns ``index`` (input-sharded), ``None`` when it holds the whole weight."""

    hf_module: str
    dim: int | None
    index: tuple[int, ...] = ()

    @property
    def short_name(self) -> str:
        return self.hf_module.rsplit(".", 1)[-1]


#: (base weight parameter name, TP size, TP rank) -> [(hf tensor key, dim, index), ...]
Plan = Callable[[str, int, int], list[tuple[str, int | None, tuple[int, ...]]]]


def tp_size_rank(context: ParallelContext | None) -> tuple[int, int]:
    """TP size and rank in ``context`` (``(1, 0)`` without model parallelism)."""
    return dim_size(context, "tp"), dim_rank(context, "tp")


def model_spec_for(model: nn.Module) -> Any:
    """The :class:`nxd.specs.ModelSpec` of ``model``: the one whose ``build`` made it, else the
    registered spec whose model class is ``model``'s nearest (a family subclassing another's model,
    Mixtral's Llama's, finds its own), or ``None``."""
    import nxd
    from nxd.specs import spec_of

    built_by = spec_of(model)
    if built_by is not None:
        return built_by
    mro = type(model).__mro__
    found = []
    for name in nxd.list_components("model"):
        spec = nxd.get_model(name)
        cls = getattr(spec, "extras", {}).get("model_class")
        if isinstance(cls, type) and isinstance(model, cls):
            found.append((mro.index(cls), name, spec))
    return min(found, key=lambda f: f[:2])[2] if found else None


def model_plan(model: nn.Module) -> Plan | None:
    """The model plugin's layout, when it publishes one."""
    spec = model_spec_for(model)
    if spec is None:
        return None
    published = spec.extras.get("hf_param_plan")
    if callable(published):
        return lambda name, tp, rank: published(model, name, tp, rank)
    return None


def _shard_indices(total: int, stride: int, tp: int, rank: int) -> tuple[int, ...]:
    """Indices of the Megatron shard of ``total`` rows (``stride`` interleaved pieces)."""
    if tp == 1:
        return tuple(range(total))
    piece = total // (tp * stride)
    return tuple(i for s in range(stride) for i in range((s * tp + rank) * piece, (s * tp + rank + 1) * piece))


def weight_names(module: nn.Module) -> list[str]:
    """The base weight parameters of ``module`` (relative names), in output order."""
    if isinstance(module, GQAQKVColumnParallelLinear):
        return ["weight_qkv"] if module.fuse_qkv else ["weight_q", "weight_k", "weight_v"]
    return ["weight"]


def generic_slots(name: str, module: nn.Module, tp: int, rank: int) -> list[Slot]:
    """Slots under the generic rule: the module name is the HF name; GQA pieces become siblings
    ``q_proj``/``k_proj``/``v_proj``."""
    if isinstance(module, (nn.Linear, nn.Embedding, *CONV_LAYERS)) or tp == 1 and not isinstance(
            module, GQAQKVColumnParallelLinear):
        return [Slot(name, None)]
    if isinstance(module, ParallelEmbedding):  # vocabulary rows of the table = columns of LoRA's A
        per = module.vocab_end_index - module.vocab_start_index
        return [Slot(name, 1, tuple(range(rank * per, (rank + 1) * per)))]
    if isinstance(module, ColumnParallelLinear):
        return [Slot(name, 0, _shard_indices(module.output_size, module.stride, tp, rank))]
    if isinstance(module, RowParallelLinear):
        return [Slot(name, 1, _shard_indices(module.input_size, module.stride, tp, rank))]
    parent = name.rsplit(".", 1)[0] + "." if "." in name else ""
    # Megatron KV layout: rank r holds KV piece r // m of the tp / m pieces.
    m = module.kv_size_multiplier
    q = _shard_indices(module.q_size, 1, tp, rank)
    kv = _shard_indices(module.kv_size, 1, tp // m, rank // m)
    return [Slot(parent + "q_proj", 0, q), Slot(parent + "k_proj", 0, kv), Slot(parent + "v_proj", 0, kv)]


def slots_for(name: str, module: nn.Module, plan: Plan | None, tp: int, rank: int) -> list[Slot]:
    """The HF modules that make up layer ``name`` on TP ``rank``, in local output order."""
    if plan is None or isinstance(module, (*CONV_LAYERS, nn.Embedding)):  # a model's layout maps TP layers
        return generic_slots(name, module, tp, rank)
    slots: list[Slot] = []
    for weight in weight_names(module):
        for hf_key, dim, index in plan(f"{name}.{weight}", tp, rank):
            if not hf_key.endswith(".weight"):
                raise ValueError(f"model layout maps {name}.{weight} to {hf_key!r}, expected a '.weight' tensor")
            if isinstance(module, ParallelEmbedding) and dim == 0:
                dim = 1  # the table's vocabulary rows are LoRA A's columns
            slots.append(Slot(hf_key[: -len(".weight")], dim, tuple(index)))
    return slots


def bias_pieces(name: str, plan: Plan | None, tp: int, rank: int, param: torch.Tensor) -> list[tuple[str, int | None,
                                                                                                  tuple[int, ...]]]:
    """HF tensors making up a base bias parameter (for ``bias="all"|"lora_only"`` export)."""
    if plan is not None:
        return [(k, d, tuple(i)) for k, d, i in plan(name, tp, rank)]
    if getattr(param, "tensor_model_parallel", False) and tp > 1:
        total = param.shape[0] * tp
        return [(name, 0, _shard_indices(total, getattr(param, "partition_stride", 1), tp, rank))]
    return [(name, None, ())]
