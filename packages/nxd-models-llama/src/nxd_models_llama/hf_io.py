"""Hugging Face checkpoint import (each TP rank reads only its slices) and export."""

from __future__ import annotations

import os

import torch
from torch import nn

from nxd_modeling.hf_interop import tp_size_and_rank, unwrap_local_module
from nxd_modeling.hf_pipeline import HfFamilyIO, HfMapping, mapping_context
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


def hf_mapping(module: nn.Module) -> HfMapping:
    """An (unwrapped) Llama model's Hugging Face mapping at its context's TP size."""
    context = mapping_context(module)  # None while plain: whole tensors
    config, (tp, _), multiplier = module.config, tp_size_and_rank(context), kv_size_multiplier(module)
    return HfMapping(pieces=lambda name, rank: plan_for(name, config, tp, rank, multiplier), shapes=hf_shapes(config),
                     hf_config=config.to_hf_dict, context=context, tied=config.tie_word_embeddings)


#: import/export through the shared pipeline (files over 5 GiB are sharded, as transformers does)
HF_IO = HfFamilyIO(unwrap_model, hf_mapping, _SHAPE_FIELDS, max_shard_size=5 * 2**30)


def load_hf_checkpoint(model: nn.Module, hf_dir: str | os.PathLike, strict: bool = True) -> None:
    """Load a Hugging Face Llama directory into ``model`` at the current TP degree.

    Each rank opens the safetensors files and reads only the slices its shards need. ``strict``:
    checkpoint tensors the model does not use are an error (rotary ``inv_freq`` buffers excepted).
    """
    HF_IO.load(model, hf_dir, strict)


def collect_hf_state_dict(model: nn.Module, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """The full HF-named state dict, assembled from all TP ranks and, under pipeline parallelism,
    from every stage's layers (collective: every rank calls it).

    Returns the tensors on the rank that writes files and an empty dict elsewhere."""
    return HF_IO.collect(model, dtype)


def save_hf_checkpoint(model: nn.Module, out_dir: str | os.PathLike, dtype: torch.dtype | None = None,
                       max_shard_size: int = 5 * 2**30) -> None:
    """Write ``config.json`` + ``model.safetensors`` (or shards + index) that
    ``transformers.LlamaForCausalLM.from_pretrained`` loads. Collective over all ranks (TP and
    pipeline stages); one rank writes."""
    HF_IO.save(model, out_dir, dtype, max_shard_size)
