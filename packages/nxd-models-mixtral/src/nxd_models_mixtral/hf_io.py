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
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from nxd_core_parallel import parallel_state
from nxd_core_parallel.hf_interop import (
    SafetensorsCheckpoint,
    check_config_fields,
    clean_param_name,
    gather_over,
    gather_shards,
    tp_size_and_rank,
    unwrap_local_module,
    write_hf_dir,
)
from nxd_core_parallel.vocab_padding import real_vocab_rows
from nxd_models_llama.hf_mapping import Piece, plan_for
from nxd_models_mixtral.config import MixtralConfig
from nxd_moe import expert_parallel_groups

_EXPERT = re.compile(r"^model\.layers\.(\d+)\.block_sparse_moe\.experts\.(gate_up_proj|down_proj)$")
_ROUTER = re.compile(r"^model\.layers\.(\d+)\.block_sparse_moe\.router\.weight$")
#: vocabulary-parallel parameters (Megatron's vocabulary padding adds rows the checkpoint does not hold)
_VOCAB = ("model.embed_tokens.weight", "lm_head.weight")
_SHAPE_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "head_dim", "tie_word_embeddings", "num_local_experts")


def unwrap_model(model: nn.Module) -> nn.Module:
    """The :class:`MixtralForCausalLM` inside an ``NxDModel`` (or the model itself)."""
    return unwrap_local_module(model, MixtralConfig, "MixtralForCausalLM")


def _kv_multiplier(model: nn.Module) -> int:
    return model.model.layers[0].self_attn.kv_size_multiplier if len(model.model.layers) else 1


def expert_pieces(name: str, config: MixtralConfig, tp: int, tp_rank: int, ep: int, ep_rank: int
                  ) -> list[list[Piece]] | None:
    """For an expert parameter: per local expert, the HF pieces (concatenated along dim 0 of the
    local expert's matrix for gate_up, dim 1 for down). ``None`` for other parameters."""
    match = _EXPERT.match(name)
    if match is None:
        return None
    layer, which = match.groups()
    inter = config.intermediate_size // tp
    rows = tuple(range(tp_rank * inter, (tp_rank + 1) * inter))
    local = config.num_local_experts // ep
    out = []
    for e in range(ep_rank * local, (ep_rank + 1) * local):
        prefix = f"model.layers.{layer}.block_sparse_moe.experts.{e}."
        if which == "gate_up_proj":
            out.append([Piece(prefix + "w1.weight", 0, rows), Piece(prefix + "w3.weight", 0, rows)])
        else:
            out.append([Piece(prefix + "w2.weight", 1, rows)])
    return out


def plain_pieces(name: str, config: MixtralConfig, tp: int, tp_rank: int, multiplier: int) -> list[Piece]:
    match = _ROUTER.match(name)
    if match:
        return [Piece(f"model.layers.{match.group(1)}.block_sparse_moe.gate.weight", None)]
    padded = config.padded_vocab_size(tp)
    if name in _VOCAB and padded != config.vocab_size:  # only the real rows of this rank's padded slice
        return [Piece(name, 0, tuple(real_vocab_rows(config.vocab_size, padded, tp, tp_rank)))]
    return plan_for(name, config, tp, tp_rank, multiplier)


def hf_shapes(config: MixtralConfig) -> dict[str, tuple[int, ...]]:
    h, v, hd, inter, e = (config.hidden_size, config.vocab_size, config.head_dim, config.intermediate_size,
                          config.num_local_experts)
    q, kv = config.num_attention_heads * hd, config.num_key_value_heads * hd
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,)}
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (v, h)
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                       p + "self_attn.q_proj.weight": (q, h), p + "self_attn.k_proj.weight": (kv, h),
                       p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, q),
                       p + "block_sparse_moe.gate.weight": (e, h)})
        for x in range(e):
            m = f"{p}block_sparse_moe.experts.{x}."
            shapes.update({m + "w1.weight": (inter, h), m + "w3.weight": (inter, h), m + "w2.weight": (h, inter)})
    return shapes


def _read(ckpt: SafetensorsCheckpoint, pieces: list[Piece], expected: dict, used: set[str], hf_dir: Path
          ) -> torch.Tensor:
    parts = []
    for piece in pieces:
        shape = ckpt.shape(piece.hf_key)
        if shape != expected[piece.hf_key]:
            raise ValueError(f"{hf_dir}: {piece.hf_key} has shape {list(shape)}, expected {list(expected[piece.hf_key])}")
        parts.append(ckpt.read(piece))
        used.add(piece.hf_key)
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=pieces[0].dim)


@torch.no_grad()
def load_hf_checkpoint(model: nn.Module, hf_dir: str | os.PathLike, strict: bool = True) -> None:
    """Load a Hugging Face Mixtral directory into ``model`` at the current TP/EP degrees; each rank
    reads only the rows/columns of its shards and only its own experts."""
    module = unwrap_model(model)
    config, hf_dir = module.config, Path(hf_dir)
    check_config_fields(config, hf_dir, MixtralConfig.from_dict, _SHAPE_FIELDS)
    tp, tp_rank = tp_size_and_rank()
    groups = expert_parallel_groups(module.parallel_context)
    multiplier = _kv_multiplier(module)
    expected = hf_shapes(config)
    used: set[str] = set()
    with SafetensorsCheckpoint(hf_dir) as ckpt:
        for raw_name, param in module.named_parameters():
            name = clean_param_name(raw_name)
            if param.is_meta:
                raise ValueError(f"parameter {name} is on the meta device: materialise the model before loading")
            per_expert = expert_pieces(name, config, tp, tp_rank, groups.ep_size, groups.ep_rank)
            if per_expert is not None:
                tensor = torch.stack([_read(ckpt, pieces, expected, used, hf_dir) for pieces in per_expert])
            else:
                pieces = plain_pieces(name, config, tp, tp_rank, multiplier)
                if name in _VOCAB and len(pieces[0].index) < param.shape[0]:  # padding rows start at zero
                    tensor = param.new_zeros(param.shape)
                    used.add(pieces[0].hf_key)  # a rank may hold only padding
                    if pieces[0].index:
                        tensor[:len(pieces[0].index)] = _read(ckpt, pieces, expected, used, hf_dir)
                else:
                    tensor = _read(ckpt, pieces, expected, used, hf_dir)
            if tensor.shape != param.shape:
                raise ValueError(f"{name}: checkpoint slices give shape {list(tensor.shape)}, the parameter has "
                                 f"{list(param.shape)}")
            param.copy_(tensor.to(param.dtype))
        if config.tie_word_embeddings:
            used.add("lm_head.weight")
        if groups.ep_size > 1:  # other EP ranks read the other experts
            used |= {k for k in ckpt.keys() if ".block_sparse_moe.experts." in k}
        leftover = sorted(k for k in ckpt.keys() - used if not k.endswith("rotary_emb.inv_freq"))
        if leftover and strict:
            raise ValueError(f"{hf_dir}: tensors not used by the model: {leftover[:5]}; pass strict=False to ignore them")


def _writes_files() -> bool:
    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


@torch.no_grad()
def collect_hf_state_dict(model: nn.Module, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """The full HF-named state dict, gathered over TP and EP (collective: every rank calls it);
    returned on global rank 0, empty elsewhere."""
    module = unwrap_model(model)
    config = module.config
    if parallel_state.get_pipeline_model_parallel_size() > 1:
        raise NotImplementedError("save_hf_checkpoint with pipeline parallelism: gather the stages first")
    tp, _ = tp_size_and_rank()
    groups = expert_parallel_groups(module.parallel_context)
    multiplier = _kv_multiplier(module)
    writer = _writes_files()
    out: dict[str, torch.Tensor] = {}
    shapes = hf_shapes(config)

    def put(piece: Piece, chunk: torch.Tensor) -> None:
        target = out.setdefault(piece.hf_key, torch.empty(shapes[piece.hf_key], dtype=dtype or chunk.dtype))
        if piece.dim is None:
            target.copy_(chunk)
        else:
            target.index_copy_(piece.dim, torch.tensor(piece.index), chunk.to(target.dtype))

    for raw_name, param in module.named_parameters():
        name = clean_param_name(raw_name)
        tp_shards = gather_shards(param, tp)
        if _EXPERT.match(name):
            by_rank = [gather_over(shard, groups.ep_size, groups.ep_group) for shard in tp_shards]  # [tp][ep]
            if not writer:
                continue
            for r in range(tp):
                for q in range(groups.ep_size):
                    for experts, matrix in zip(expert_pieces(name, config, tp, r, groups.ep_size, q), by_rank[r][q]):
                        dim = experts[0].dim
                        for piece, chunk in zip(experts, matrix.split([len(p.index) for p in experts], dim=dim)):
                            put(piece, chunk)
            continue
        if not writer:
            continue
        for r, shard in enumerate(tp_shards):
            pieces = plain_pieces(name, config, tp, r, multiplier)
            if name in _VOCAB:
                shard = shard[:len(pieces[0].index)]  # drop the vocabulary padding
                if not pieces[0].index:
                    continue
            if pieces[0].dim is None:
                put(pieces[0], shard)
                continue
            for piece, chunk in zip(pieces, shard.split([len(p.index) for p in pieces], dim=pieces[0].dim)):
                put(piece, chunk)
    if writer and set(out) != set(shapes):
        raise RuntimeError(f"export is missing HF tensors {sorted(set(shapes) - set(out))[:5]}")
    return out


def save_hf_checkpoint(model: nn.Module, out_dir: str | os.PathLike, dtype: torch.dtype | None = None) -> None:
    """Write ``config.json`` + ``model.safetensors`` that ``transformers.MixtralForCausalLM``
    loads (collective over all ranks; global rank 0 writes)."""
    module = unwrap_model(model)
    tensors = collect_hf_state_dict(module, dtype)
    if tensors:
        write_hf_dir(out_dir, module.config.to_hf_dict(), tensors, dtype)
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
