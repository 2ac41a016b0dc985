"""Hugging Face import/export of a transformers model through nxd's one pipeline (``hf_pipeline``).

The parameter names are the checkpoint's (the model is transformers' own class), so the mapping is
the identity: a TP-sharded parameter is its rank's contiguous rows (or columns) of the tensor of the
same name, every other parameter the whole tensor. Every file goes through
``SafetensorsCheckpoint`` (checksums of an nxd export verified, index entries kept inside the folder,
every error naming the file); the export writes ``config.json`` + safetensors as ``save_pretrained``
lays them out (a tied LM head not stored)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from nxd.errors import ConfigError
from nxd.parallel import dim_size
from nxd_modeling.hf_interop import clean_param_name, tp_size_and_rank
from nxd_modeling.hf_pipeline import HfFamilyIO, HfMapping, Piece, mapping_context
from nxd_models_transformers.model import NxdCausalLMMixin, whole_on_meta

#: config.json fields a folder must agree on with the model it is loaded into (when both have them)
SHAPE_FIELDS = ("model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "num_key_value_heads", "head_dim", "tie_word_embeddings")


def unwrap_model(model: nn.Module) -> nn.Module:
    """The transformers model inside an ``NxDModel`` (or the model itself)."""
    if hasattr(model, "local_module") and callable(model.local_module):
        model = model.local_module()
    if not isinstance(model, NxdCausalLMMixin):
        raise TypeError(f"expected a model built by nxd-models-transformers, got {type(model).__name__}")
    return model


def hf_config_dict(module: nn.Module) -> dict[str, Any]:
    """The ``config.json`` ``save_pretrained`` writes for ``module`` (its transformers class named)."""
    config = module.config.to_dict()
    hf_class = type(module).__mro__[2]  # (nxd subclass, mixin, transformers class, ...)
    config["architectures"] = [hf_class.__name__]
    return config


def hf_mapping(module: nn.Module) -> HfMapping:
    """The identity mapping at the model's TP size (shapes from the parameters: whole under FSDP).
    A pipeline stage holds only its own layers: the other stages' shapes, and whether the head is
    tied, come from the whole model built on the meta device; the copy of a tied weight a later
    stage keeps as ``lm_head.weight`` is read from (and assembled into) the embedding's tensor."""
    context = mapping_context(module)
    tp, _ = tp_size_and_rank(context)
    whole = whole_on_meta(module) if dim_size(context, "pp") > 1 else module
    head, embed = whole.get_output_embeddings(), whole.get_input_embeddings()
    tied = head is not None and embed is not None and head.weight is embed.weight
    embed_key = next(clean_param_name(n) for n, p in whole.named_parameters() if p is embed.weight) if tied else ""

    def hf_key(name: str) -> str:
        return embed_key if tied and name == "lm_head.weight" else name

    shapes = {clean_param_name(n): tuple(p.shape) for n, p in whole.named_parameters()} if whole is not module else {}
    sharded: dict[str, tuple[int, int]] = {}
    for raw, param in module.named_parameters():
        name, shape = clean_param_name(raw), list(param.shape)
        if tp > 1 and getattr(param, "tensor_model_parallel", False):
            dim, m = param.partition_dim, int(getattr(param, "kv_size_multiplier", 1) or 1)
            sharded[name] = (dim, shape[dim], m)
            shape[dim] = shape[dim] * tp // m  # K/V replicated: piece rank // m of tp // m
        shapes[hf_key(name)] = tuple(shape)

    def pieces(name: str, rank: int) -> list[Piece]:
        if name not in sharded:
            return [Piece(hf_key(name), None)]
        dim, local, m = sharded[name]
        start = rank // m * local
        return [Piece(hf_key(name), dim, tuple(range(start, start + local)))]

    return HfMapping(pieces=pieces, shapes=shapes, hf_config=lambda: hf_config_dict(module), context=context,
                     tied=tied, buffers=())


def check_folder_config(module: nn.Module, hf_dir: str | os.PathLike) -> None:
    """The folder's ``config.json`` describes the model it is loaded into (the fields both name)."""
    path = Path(hf_dir) / "config.json"
    if not path.is_file():
        return  # a weights-only folder: every tensor's shape is still checked
    try:
        theirs = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid JSON ({exc})") from None
    ours = module.config.to_dict()
    for field in SHAPE_FIELDS:
        if field in theirs and field in ours and theirs[field] != ours[field]:
            raise ConfigError(f"{path}: {field}={theirs[field]!r} but the model was built with {field}={ours[field]!r}")


HF_IO = HfFamilyIO(unwrap_model, hf_mapping, shape_fields=(), max_shard_size=5 * 2**30)


def load_hf_checkpoint(model: nn.Module, hf_dir: str | os.PathLike, strict: bool = True) -> None:
    """Load a Hugging Face folder into ``model`` at its TP size; each rank reads only its slices."""
    check_folder_config(unwrap_model(model), hf_dir)
    HF_IO.load(model, hf_dir, strict)


def save_hf_checkpoint(model: nn.Module, out_dir: str | os.PathLike, dtype: torch.dtype | None = None,
                       max_shard_size: int = 5 * 2**30) -> None:
    """Write what ``save_pretrained`` writes (config.json + safetensors, names unchanged), loadable by
    ``AutoModelForCausalLM.from_pretrained``. Collective over all ranks; one rank writes."""
    HF_IO.save(model, out_dir, dtype, max_shard_size)
