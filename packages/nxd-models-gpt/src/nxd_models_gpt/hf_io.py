"""Hugging Face GPT-2 / GPT-NeoX checkpoint import (each TP rank reads only its slices) and export."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from nxd_core_parallel.hf_interop import (
    SafetensorsCheckpoint,
    assembles_stage,
    check_config_fields,
    check_unused,
    exported_parameters,
    gather_pipeline_stages,
    gather_shards,
    loadable_parameters,
    tp_size_and_rank,
    unwrap_local_module,
    write_hf_dir,
    writes_files,
)
from nxd_models_gpt.config import GPTConfig
from nxd_models_gpt.hf_mapping import (
    HF_KEY_ALIASES,
    Piece,
    check_exportable,
    default_layout,
    hf_shapes,
    plan_for,
    to_hf_config,
)

#: Config fields that must agree between a checkpoint and the model it is loaded into.
_SHAPE_FIELDS = ("vocab_size", "hidden_size", "ffn_hidden_size", "num_layers", "num_attention_heads",
                 "max_position_embeddings", "position_embedding_type", "share_embeddings_and_output_weights")


def unwrap_model(model: nn.Module) -> nn.Module:
    """The :class:`GPTForCausalLM` inside an ``NxDModel`` (or the model itself)."""
    return unwrap_local_module(model, GPTConfig, "GPTForCausalLM")


def _local_tensor(ckpt: SafetensorsCheckpoint, pieces: list[Piece], param: torch.Tensor,
                  expected: dict[str, tuple[int, ...]], hf_dir: Path) -> torch.Tensor:
    parts = []
    for piece in pieces:
        if piece.hf_key is None:  # vocabulary padding rows
            parts.append(torch.zeros(len(piece.index), *param.shape[1:], dtype=param.dtype))
            continue
        shape = ckpt.shape(piece.hf_key)
        if shape != expected[piece.hf_key]:
            raise ValueError(f"{hf_dir}: {piece.hf_key} has shape {list(shape)}, expected "
                             f"{list(expected[piece.hf_key])} for this config")
        parts.append(ckpt.read(piece).to(param.dtype))
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)


@torch.no_grad()
def load_hf_checkpoint(model: nn.Module, hf_dir: str | os.PathLike, layout: str | None = None,
                       strict: bool = True) -> None:
    """Load a Hugging Face GPT-2 (``layout="gpt2"``) or GPT-NeoX (``"gpt_neox"``) directory into
    ``model`` at the current TP degree; each rank reads only the slices its shards need.
    ``layout`` defaults from the checkpoint's ``config.json`` / the model config."""
    module = unwrap_model(model)
    context = module.parallel_context
    config, hf_dir = module.config, Path(hf_dir)
    check_config_fields(config, hf_dir, GPTConfig.from_dict, _SHAPE_FIELDS)
    if layout is None:
        cfg_path = hf_dir / "config.json"
        model_type = json.loads(cfg_path.read_text()).get("model_type") if cfg_path.is_file() else None
        layout = {"gpt2": "gpt2", "gpt_neox": "gpt_neox"}.get(model_type) or default_layout(config)
    check_exportable(config, layout)
    tp, rank = tp_size_and_rank(context)
    expected = hf_shapes(config, layout)
    used: set[str] = set()
    with SafetensorsCheckpoint(hf_dir, HF_KEY_ALIASES) as ckpt:
        for name, param in loadable_parameters(module):
            pieces = plan_for(name, config, layout, tp, rank, module.padded_vocab_size)
            tensor = _local_tensor(ckpt, pieces, param, expected, hf_dir)
            used.update(ckpt.resolve(p.hf_key) for p in pieces if p.hf_key)
            if tensor.shape != param.shape:
                raise ValueError(f"{name}: checkpoint slices give shape {list(tensor.shape)}, the parameter on TP "
                                 f"rank {rank} has {list(param.shape)}")
            param.copy_(tensor)
        # other TP ranks read the rest (a rank may hold only vocabulary padding)
        used.update(ckpt.resolve(key) for key in expected)
        if config.share_embeddings_and_output_weights:
            used.add("lm_head.weight")  # tied checkpoints may still store it
        check_unused(ckpt, used, strict, context=context, buffers=("rotary_emb.inv_freq", "attn.bias", "attn.masked_bias",
                                                  "attention.bias", "attention.masked_bias"))


@torch.no_grad()
def collect_hf_state_dict(model: nn.Module, layout: str | None = None,
                          dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """The full HF-named state dict assembled from all TP ranks and, under pipeline parallelism,
    from every stage's layers (collective: every rank calls it); the tensors on the writing rank, an
    empty dict elsewhere."""
    module = unwrap_model(model)
    context = module.parallel_context
    config = module.config
    layout = layout or default_layout(config)
    check_exportable(config, layout)
    tp, _ = tp_size_and_rank(context)
    assembler = assembles_stage(context)  # of this pipeline stage's tensors
    shapes = hf_shapes(config, layout)
    out: dict[str, torch.Tensor] = {}
    for name, param in exported_parameters(module):  # this stage's layers, under their global indices
        shards = gather_shards(param, tp, context)
        if not assembler:
            continue
        for r, shard in enumerate(shards):
            pieces = plan_for(name, config, layout, tp, r, module.padded_vocab_size)
            sizes = [len(p.index) if p.dim is not None else shard.shape[0] for p in pieces]
            chunks = shard.split(sizes, dim=0) if len(pieces) > 1 else [shard]
            for piece, chunk in zip(pieces, chunks):
                if piece.hf_key is None:
                    continue
                target = dtype or param.dtype
                if piece.hf_key not in out:
                    out[piece.hf_key] = torch.empty(shapes[piece.hf_key], dtype=target)
                chunk = chunk.t() if piece.transpose else chunk
                if piece.dim is None:
                    out[piece.hf_key].copy_(chunk)
                else:
                    out[piece.hf_key].index_copy_(piece.dim, torch.tensor(piece.index), chunk.to(target))
    out = gather_pipeline_stages(out, context)
    if writes_files(context) and set(out) != set(shapes):
        raise RuntimeError(f"export is missing HF tensors {sorted(set(shapes) - set(out))}")
    return out


def save_hf_checkpoint(model: nn.Module, out_dir: str | os.PathLike, layout: str | None = None,
                       dtype: torch.dtype | None = None) -> None:
    """Write ``config.json`` + ``model.safetensors`` that ``GPT2LMHeadModel`` (``layout="gpt2"``) or
    ``GPTNeoXForCausalLM`` (``"gpt_neox"``) ``.from_pretrained`` loads. Collective over all ranks
    (TP and pipeline stages); one rank writes. The Megatron vocabulary padding is dropped."""
    module = unwrap_model(model)
    layout = layout or default_layout(module.config)
    tensors = collect_hf_state_dict(module, layout, dtype)
    if tensors:
        write_hf_dir(out_dir, to_hf_config(module.config, layout), tensors, dtype)
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
