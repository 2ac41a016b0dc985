"""Hugging Face GPT-2 / GPT-NeoX checkpoint import (each TP rank reads only its slices) and export."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from torch import nn

from nxd_modeling.hf_interop import tp_size_and_rank, unwrap_local_module
from nxd_modeling.hf_pipeline import HfFamilyIO, HfMapping, mapping_context
from nxd_models_gpt.config import GPTConfig
from nxd_models_gpt.hf_mapping import (
    HF_KEY_ALIASES,
    check_exportable,
    default_layout,
    hf_shapes,
    plan_for,
    to_hf_config,
)

#: Config fields that must agree between a checkpoint and the model it is loaded into.
_SHAPE_FIELDS = ("vocab_size", "hidden_size", "ffn_hidden_size", "num_layers", "num_attention_heads",
                 "max_position_embeddings", "position_embedding_type", "share_embeddings_and_output_weights")
#: tensors HF GPT-2/NeoX checkpoints store that nxd recomputes
_BUFFERS = ("rotary_emb.inv_freq", "attn.bias", "attn.masked_bias", "attention.bias", "attention.masked_bias")


def unwrap_model(model: nn.Module) -> nn.Module:
    """The :class:`GPTForCausalLM` inside an ``NxDModel`` (or the model itself)."""
    return unwrap_local_module(model, GPTConfig, "GPTForCausalLM")


def hf_mapping(module: nn.Module, layout: str | None = None) -> HfMapping:
    """An (unwrapped) GPT model's mapping to the ``gpt2`` or ``gpt_neox`` layout at its context's TP size."""
    config = module.config
    layout = layout or default_layout(config)
    check_exportable(config, layout)
    context = mapping_context(module)  # None while plain: whole tensors
    tp, _ = tp_size_and_rank(context)
    return HfMapping(pieces=lambda name, rank: plan_for(name, config, layout, tp, rank, module.padded_vocab_size),
                     shapes=hf_shapes(config, layout), hf_config=lambda: to_hf_config(config, layout), context=context,
                     tied=config.share_embeddings_and_output_weights, aliases=HF_KEY_ALIASES, buffers=_BUFFERS)


HF_IO = HfFamilyIO(unwrap_model, hf_mapping, _SHAPE_FIELDS)


def checkpoint_layout(hf_dir: str | os.PathLike, config: GPTConfig) -> str:
    """The layout a checkpoint's ``config.json`` names (``model_type``), else the model config's."""
    path = Path(hf_dir) / "config.json"
    model_type = json.loads(path.read_text()).get("model_type") if path.is_file() else None
    return {"gpt2": "gpt2", "gpt_neox": "gpt_neox"}.get(model_type) or default_layout(config)


def load_hf_checkpoint(model: nn.Module, hf_dir: str | os.PathLike, layout: str | None = None,
                       strict: bool = True) -> None:
    """Load a Hugging Face GPT-2 (``layout="gpt2"``) or GPT-NeoX (``"gpt_neox"``) directory into
    ``model`` at the current TP degree; each rank reads only the slices its shards need.
    ``layout`` defaults from the checkpoint's ``config.json`` / the model config."""
    HF_IO.load(model, hf_dir, strict, layout=layout or checkpoint_layout(hf_dir, unwrap_model(model).config))


def collect_hf_state_dict(model: nn.Module, layout: str | None = None,
                          dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """The full HF-named state dict assembled from all TP ranks and, under pipeline parallelism,
    from every stage's layers (collective: every rank calls it); the tensors on the writing rank, an
    empty dict elsewhere."""
    return HF_IO.collect(model, dtype, layout=layout)


def save_hf_checkpoint(model: nn.Module, out_dir: str | os.PathLike, layout: str | None = None,
                       dtype: torch.dtype | None = None) -> None:
    """Write ``config.json`` + ``model.safetensors`` that ``GPT2LMHeadModel`` (``layout="gpt2"``) or
    ``GPTNeoXForCausalLM`` (``"gpt_neox"``) ``.from_pretrained`` loads. Collective over all ranks
    (TP and pipeline stages); one rank writes. The Megatron vocabulary padding is dropped."""
    HF_IO.save(model, out_dir, dtype, layout=layout)
