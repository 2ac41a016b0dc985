"""Hugging Face checkpoint import (each TP rank reads only its slices) and export."""

from __future__ import annotations

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
    place_piece,
    split_by_pieces,
    tp_size_and_rank,
    unwrap_local_module,
    write_hf_dir,
    writes_files,
)
from nxd_models_llama.config import LlamaConfig
from nxd_models_llama.hf_mapping import hf_shapes, plan_for

#: Config fields that must agree between a checkpoint and the model it is loaded into.
_SHAPE_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "head_dim", "tie_word_embeddings", "attention_bias", "mlp_bias")


def unwrap_model(model: nn.Module) -> nn.Module:
    """The :class:`LlamaForCausalLM` inside an ``NxDModel`` (or the model itself)."""
    return unwrap_local_module(model, LlamaConfig, "LlamaForCausalLM")


def kv_size_multiplier(model: nn.Module) -> int:
    """How many times the KV heads of an (unwrapped) Llama-shaped model are replicated over TP
    (Mixtral's decoder shares the layout)."""
    layer = next(iter(model.model.layers), None)  # under pipeline parallelism: this stage's first layer
    return layer.self_attn.kv_size_multiplier if layer is not None else 1


@torch.no_grad()
def load_hf_checkpoint(model: nn.Module, hf_dir: str | os.PathLike, strict: bool = True) -> None:
    """Load a Hugging Face Llama directory into ``model`` at the current TP degree.

    Each rank opens the safetensors files and reads only the slices its shards need. ``strict``:
    checkpoint tensors the model does not use are an error (rotary ``inv_freq`` buffers excepted).
    """
    module = unwrap_model(model)
    context = module.parallel_context
    config, hf_dir = module.config, Path(hf_dir)
    check_config_fields(config, hf_dir, type(config).from_dict, _SHAPE_FIELDS)  # a subclass reads its own family
    tp, rank = tp_size_and_rank(context)
    multiplier = kv_size_multiplier(module)
    expected = hf_shapes(config)
    used: set[str] = set()
    with SafetensorsCheckpoint(hf_dir) as ckpt:
        for name, param in loadable_parameters(module):
            tensor = ckpt.read_pieces(plan_for(name, config, tp, rank, multiplier), expected, used)
            if tensor.shape != param.shape:
                raise ValueError(f"{name}: checkpoint slices give shape {list(tensor.shape)}, the parameter on TP rank "
                                 f"{rank} has {list(param.shape)}")
            param.copy_(tensor.to(param.dtype))
        if config.tie_word_embeddings:
            used.add("lm_head.weight")  # some tied checkpoints still store it
        check_unused(ckpt, used, strict, context=context)


@torch.no_grad()
def collect_hf_state_dict(model: nn.Module, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """The full HF-named state dict, assembled from all TP ranks and, under pipeline parallelism,
    from every stage's layers (collective: every rank calls it).

    Returns the tensors on the rank that writes files and an empty dict elsewhere."""
    module = unwrap_model(model)
    context = module.parallel_context
    config = module.config
    tp, _ = tp_size_and_rank(context)
    multiplier = kv_size_multiplier(module)
    assembler = assembles_stage(context)
    shapes = hf_shapes(config)
    out: dict[str, torch.Tensor] = {}
    for name, param in exported_parameters(module):  # this stage's layers, under their global indices
        shards = gather_shards(param, tp, context)
        if not assembler:
            continue
        for r, shard in enumerate(shards):
            pieces = plan_for(name, config, tp, r, multiplier)
            for piece, chunk in zip(pieces, split_by_pieces(shard, pieces)):
                place_piece(out, shapes[piece.hf_key], piece, chunk, dtype)
    out = gather_pipeline_stages(out, context)
    if writes_files(context) and set(out) != set(shapes):
        raise RuntimeError(f"export is missing HF tensors {sorted(set(shapes) - set(out))}")
    return out


def save_hf_checkpoint(model: nn.Module, out_dir: str | os.PathLike, dtype: torch.dtype | None = None,
                       max_shard_size: int = 5 * 2**30) -> None:
    """Write ``config.json`` + ``model.safetensors`` (or shards + index) that
    ``transformers.LlamaForCausalLM.from_pretrained`` loads. Collective over all ranks (TP and
    pipeline stages); one rank writes."""
    module = unwrap_model(model)
    tensors = collect_hf_state_dict(module, dtype)
    if tensors:
        write_hf_dir(out_dir, module.config.to_hf_dict(), tensors, dtype, max_shard_size)
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
