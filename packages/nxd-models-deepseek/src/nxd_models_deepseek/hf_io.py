"""DeepSeek-V3's Hugging Face import/export: nxd-models-mixtral's mapping (MLA's pieces come from
the config), plus the multi-token prediction modules under their checkpoint names
``model.layers.{num_hidden_layers + k}.*`` (nxd: ``mtp.{k}.*``; the block's weights as any layer's,
``enorm``/``hnorm``/``eh_proj``/``shared_head.norm`` whole). Without ``mtp_depth`` a checkpoint's
MTP tensors (DeepSeek's releases hold one module) are left unread, as transformers does."""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

from nxd.errors import ConfigError
from nxd_modeling.hf_interop import SafetensorsCheckpoint
from nxd_modeling.hf_pipeline import HfFamilyIO, HfMapping, Piece
from nxd_models_deepseek.config import DeepseekV3Config
from nxd_models_mixtral import hf_io as mixtral_hf_io

_MTP = re.compile(r"^mtp\.(\d+)\.(.+)$")
#: the MTP module's own tensors (replicated; the block's follow the layer mapping)
MTP_EXTRAS = ("enorm.weight", "hnorm.weight", "eh_proj.weight", "shared_head.norm.weight")


def hf_name(name: str, config: DeepseekV3Config) -> str:
    """An nxd parameter name as the checkpoint names it (``mtp.{k}.x`` -> ``model.layers.{L + k}.x``)."""
    match = _MTP.match(name)
    return f"model.layers.{config.num_hidden_layers + int(match.group(1))}.{match.group(2)}" if match else name


def _is_mtp_key(key: str, config: DeepseekV3Config) -> bool:
    match = re.match(r"^model\.layers\.(\d+)\.", key)
    return match is not None and int(match.group(1)) >= config.num_hidden_layers


def _mtp_extra_shapes(config: DeepseekV3Config) -> dict[str, tuple[int, ...]]:
    h = config.hidden_size
    extra = {"enorm.weight": (h,), "hnorm.weight": (h,), "eh_proj.weight": (h, 2 * h), "shared_head.norm.weight": (h,)}
    return {f"model.layers.{config.num_hidden_layers + k}.{name}": shape
            for k in range(config.mtp_depth) for name, shape in extra.items()}


def hf_mapping(module: nn.Module) -> HfMapping:
    """Mixtral's mapping of an (unwrapped) DeepSeek-V3 model over its layers and MTP blocks (layers
    ``L .. L + mtp_depth - 1`` of the checkpoint), plus the MTP modules' own tensors."""
    config: DeepseekV3Config = module.config
    if not config.mtp_depth:
        base = mixtral_hf_io.hf_mapping(module)
        return dataclasses.replace(base, read_elsewhere=lambda ckpt: base.read_elsewhere(ckpt) | {
            k for k in ckpt.keys() if _is_mtp_key(k, config)})
    deeper = dataclasses.replace(config, num_hidden_layers=config.num_hidden_layers + config.mtp_depth)
    base = mixtral_hf_io.hf_mapping(module, deeper)

    def tensors(model: nn.Module, export: bool) -> Iterator[tuple[str, torch.Tensor]]:
        return ((hf_name(name, config), t) for name, t in base.tensors(model, export))

    def pieces(name: str, rank: int) -> list[Piece]:
        return [Piece(name, None)] if _is_mtp_key(name, config) and name.endswith(MTP_EXTRAS) else base.pieces(name, rank)

    return dataclasses.replace(base, tensors=tensors, pieces=pieces, shapes={**base.shapes, **_mtp_extra_shapes(config)},
                               hf_config=config.to_hf_dict)


def _check_mtp_weights(model: nn.Module, hf_dir: str | os.PathLike) -> None:
    """``mtp_depth`` modules need their weights in the checkpoint: refused by name when absent."""
    config = mixtral_hf_io.unwrap_model(model).config
    if not config.mtp_depth:
        return
    with SafetensorsCheckpoint(Path(hf_dir)) as ckpt:
        keys = ckpt.keys()
    missing = [f"model.layers.{config.num_hidden_layers + k}.eh_proj.weight" for k in range(config.mtp_depth)
               if f"model.layers.{config.num_hidden_layers + k}.eh_proj.weight" not in keys]
    if missing:
        raise ConfigError(f"mtp_depth={config.mtp_depth}: {hf_dir} holds no multi-token prediction module for "
                          f"{missing} (DeepSeek's released checkpoints hold num_nextn_predict_layers=1 modules; "
                          "transformers' save_pretrained writes none): use mtp_depth <= the modules the checkpoint "
                          "holds, or mtp_depth=0 to import it")


HF_IO = HfFamilyIO(mixtral_hf_io.unwrap_model, hf_mapping, mixtral_hf_io.HF_IO.shape_fields)


def load_hf_checkpoint(model: nn.Module, hf_dir: str | os.PathLike, strict: bool = True) -> None:
    """Load a Hugging Face DeepSeek-V3 directory (its MTP modules too with ``mtp_depth``)."""
    _check_mtp_weights(model, hf_dir)
    HF_IO.load(model, hf_dir, strict)


def collect_hf_state_dict(model: nn.Module, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """The full HF-named state dict (MTP modules included), on global rank 0 (collective)."""
    return HF_IO.collect(model, dtype)


def save_hf_checkpoint(model: nn.Module, out_dir: str | os.PathLike, dtype: torch.dtype | None = None) -> None:
    """Write ``config.json`` + ``model.safetensors`` (MTP modules as DeepSeek's checkpoints hold them)."""
    HF_IO.save(model, out_dir, dtype)
