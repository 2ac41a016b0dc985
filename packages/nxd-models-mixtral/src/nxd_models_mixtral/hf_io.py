"""Hugging Face Mixtral checkpoint import (each rank reads only its TP/EP slices) and export.

HF tensors per layer ``model.layers.N.``: attention and norms as Llama (delegated to
nxd-models-llama's plan), ``block_sparse_moe.gate.weight`` [E, H] (the router), and per expert
``block_sparse_moe.experts.{e}.w1.weight`` (gate) [I, H], ``w3`` (up) [I, H], ``w2`` (down) [H, I].

nxd parameters: ``block_sparse_moe.router.weight`` = ``gate.weight``; ``block_sparse_moe.experts.
gate_up_proj`` [E/ep, 2I/tp, H] = for each local expert ``[w1 rows of TP rank r; w3 rows]``;
``experts.down_proj`` [E/ep, H, I/tp] = ``w2`` columns of TP rank r. EP rank ``q`` holds experts
``[q*E/ep, (q+1)*E/ep)``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator

import torch
from torch import nn

from nxd_modeling.hf_interop import (
    SafetensorsCheckpoint,
    clean_param_name,
    exported_parameters,
    gather_over,
    gather_shards,
    loadable_parameters,
    tp_size_and_rank,
    unwrap_local_module,
)
from nxd_modeling.hf_pipeline import HfFamilyIO, HfMapping, Part, Piece, mapping_context
from nxd_models_llama.hf_io import kv_size_multiplier
from nxd_models_llama.hf_mapping import tied_hf_key
from nxd_models_mixtral.config import MixtralConfig
from nxd_moe import expert_parallel_groups
from nxd_tensor_parallel.vocab_padding import real_vocab_rows


def _expert_re(config: MixtralConfig) -> re.Pattern:
    """Routed (``experts``, split over EP) and shared (``shared_experts``, never split) expert weights."""
    return re.compile(rf"^model\.layers\.(\d+)\.{config.MOE_MODULE}\.(experts|shared_experts)\.(gate_up_proj|down_proj)$")


def _router_re(config: MixtralConfig) -> re.Pattern:
    return re.compile(rf"^model\.layers\.(\d+)\.{config.MOE_MODULE}\.router\.(weight|e_score_correction_bias)$")


def _is_routed_expert(name: str, config: MixtralConfig) -> bool:
    match = _expert_re(config).match(name)
    return match is not None and match.group(2) == "experts"


def hf_tensors(module: nn.Module, export: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
    """The parameters an importer fills (an exporter assembles), plus the routers' expert biases:
    buffers, yet part of the checkpoint (HF's ``gate.e_score_correction_bias``)."""
    yield from (exported_parameters(module) if export else loadable_parameters(module))
    for raw, buf in module.named_buffers():
        if raw.endswith("router.e_score_correction_bias"):
            yield clean_param_name(raw), buf

#: vocabulary-parallel parameters (Megatron's vocabulary padding adds rows the checkpoint does not hold)
_VOCAB = ("model.embed_tokens.weight", "lm_head.weight")
_SHAPE_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "head_dim", "tie_word_embeddings", "num_local_experts")


def unwrap_model(model: nn.Module) -> nn.Module:
    """The :class:`MixtralForCausalLM` inside an ``NxDModel`` (or the model itself)."""
    return unwrap_local_module(model, MixtralConfig, "MixtralForCausalLM")


def expert_pieces(name: str, config: MixtralConfig, tp: int, tp_rank: int, ep: int, ep_rank: int
                  ) -> list[list[Piece]] | None:
    """For an expert parameter: per local expert, the HF pieces (concatenated along dim 0 of the
    local expert's matrix for gate_up, dim 1 for down). ``None`` for other parameters."""
    match = _expert_re(config).match(name)
    if match is None:
        return None
    layer, kind, which = match.groups()
    gate, up, down = config.HF_EXPERT_NAMES
    shared = kind == "shared_experts"
    inter = (config.shared_expert_intermediate_size if shared else config.expert_intermediate_size) // tp
    rows = tuple(range(tp_rank * inter, (tp_rank + 1) * inter))
    local = 1 if shared else config.num_local_experts // ep
    out = []
    for e in range(ep_rank * local, (ep_rank + 1) * local) if not shared else [None]:
        prefix = f"model.layers.{layer}.{config.MOE_MODULE}." + ("shared_experts." if shared else f"experts.{e}.")
        if which == "gate_up_proj":
            out.append([Piece(f"{prefix}{gate}.weight", 0, rows), Piece(f"{prefix}{up}.weight", 0, rows)])
        else:
            out.append([Piece(f"{prefix}{down}.weight", 1, rows)])
    return out


def plain_pieces(name: str, config: MixtralConfig, tp: int, tp_rank: int, multiplier: int) -> list[Piece]:
    match = _router_re(config).match(name)
    if match:
        return [Piece(f"model.layers.{match.group(1)}.{config.MOE_MODULE}.gate.{match.group(2)}", None)]
    padded = config.padded_vocab_size(tp)
    if name in _VOCAB and padded != config.vocab_size:  # the real rows of this rank's padded slice, then zeros
        rows = tuple(real_vocab_rows(config.vocab_size, padded, tp, tp_rank))
        return [Piece(tied_hf_key(name, config), 0, rows, zeros=padded // tp - len(rows))]
    return config.hf_pieces(name, tp, tp_rank, multiplier)


def hf_shapes(config: MixtralConfig) -> dict[str, tuple[int, ...]]:
    """Llama's tensors, the dense MLP only in layers without experts, plus each MoE layer's router
    and experts."""
    h, inter, e = config.hidden_size, config.expert_intermediate_size, config.num_local_experts
    gate, up, down = config.HF_EXPERT_NAMES
    dense = config.hf_base_shapes(dense_mlp=True)
    shapes = config.hf_base_shapes(dense_mlp=False)
    moe = config.moe_config()
    shared = config.shared_expert_intermediate_size
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        if not config.is_moe_layer(i):
            shapes.update({k: v for k, v in dense.items() if k.startswith(p + "mlp.")})
            continue
        shapes[f"{p}{config.MOE_MODULE}.gate.weight"] = (e, h)
        if moe.expert_bias:
            shapes[f"{p}{config.MOE_MODULE}.gate.e_score_correction_bias"] = (e,)
        if shared:
            m = f"{p}{config.MOE_MODULE}.shared_experts."
            shapes.update({f"{m}{gate}.weight": (shared, h), f"{m}{up}.weight": (shared, h),
                           f"{m}{down}.weight": (h, shared)})
        for x in range(e):
            m = f"{p}{config.MOE_MODULE}.experts.{x}."
            shapes.update({f"{m}{gate}.weight": (inter, h), f"{m}{up}.weight": (inter, h),
                           f"{m}{down}.weight": (h, inter)})
    return shapes


def hf_mapping(module: nn.Module, config: MixtralConfig | None = None) -> HfMapping:
    """An (unwrapped) Mixtral model's mapping at the current TP/EP sizes: Llama's attention and norms
    (``config.hf_pieces``), the routers, and the experts (each EP rank holds its own). ``config``:
    the layers to map when not the model's (DeepSeek's MTP blocks are checkpoint layers past
    ``num_hidden_layers``)."""
    context = mapping_context(module)  # None while plain: whole tensors
    config = module.config if config is None else config
    (tp, tp_rank), multiplier = tp_size_and_rank(context), kv_size_multiplier(module)
    groups = expert_parallel_groups(context)
    shapes = hf_shapes(config)

    def ep_of(name: str) -> tuple[int, int]:
        return (groups.ep_size, groups.ep_rank) if _is_routed_expert(name, config) else (1, 0)  # shared: never split

    def read(ckpt: SafetensorsCheckpoint, name: str, param: torch.Tensor, used: set[str]) -> torch.Tensor | None:
        per_expert = expert_pieces(name, config, tp, tp_rank, *ep_of(name))
        if per_expert is None:
            return None
        # [local experts (1 for the shared experts), rows, columns]
        return torch.stack([ckpt.read_pieces(pieces, shapes, used) for pieces in per_expert])

    def gather(name: str, param: torch.Tensor) -> list[Part] | None:
        if not _expert_re(config).match(name):
            return None
        ep = ep_of(name)[0]
        by_rank = [gather_over(shard, ep, groups.ep_group) if ep > 1 else [shard] for shard in gather_shards(param, tp, context)]
        return [part for r in range(tp) for q in range(ep)
                for part in zip(expert_pieces(name, config, tp, r, ep, q), by_rank[r][q])]

    def read_elsewhere(ckpt: SafetensorsCheckpoint) -> set[str]:  # other EP ranks read the other experts
        return {k for k in ckpt.keys() if f".{config.MOE_MODULE}.experts." in k} if groups.ep_size > 1 else set()

    return HfMapping(pieces=lambda name, rank: plain_pieces(name, config, tp, rank, multiplier), shapes=shapes,
                     hf_config=config.to_hf_dict, context=context, tied=config.tie_word_embeddings, tensors=hf_tensors,
                     read=read,
                     gather=gather, read_elsewhere=read_elsewhere)


HF_IO = HfFamilyIO(unwrap_model, hf_mapping, _SHAPE_FIELDS)


def load_hf_checkpoint(model: nn.Module, hf_dir: str | os.PathLike, strict: bool = True) -> None:
    """Load a Hugging Face Mixtral directory into ``model`` at the current TP/EP degrees; each rank
    reads only the rows/columns of its shards and only its own experts."""
    HF_IO.load(model, hf_dir, strict)


def collect_hf_state_dict(model: nn.Module, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """The full HF-named state dict, gathered over TP and EP and, under pipeline parallelism, from
    every stage's layers (collective: every rank calls it); returned on global rank 0, empty elsewhere."""
    return HF_IO.collect(model, dtype)


def save_hf_checkpoint(model: nn.Module, out_dir: str | os.PathLike, dtype: torch.dtype | None = None) -> None:
    """Write ``config.json`` + ``model.safetensors`` that ``transformers.MixtralForCausalLM``
    loads (collective over all ranks, every pipeline stage included; global rank 0 writes)."""
    HF_IO.save(model, out_dir, dtype)
