"""The one Hugging Face import/export pipeline every nxd model family runs.

A family states only its mapping (:class:`HfMapping`: which HF pieces make a parameter's shard on a
TP rank, every HF tensor's full shape, the ``config.json`` to write) and wraps it in an
:class:`HfFamilyIO`. The pipeline does the rest the same way for every family: each rank reads only
its slices and checks their shapes (under FSDP each rank keeps its rows of them); export gathers the shards over TP (and wherever the family
gathers more, e.g. experts over EP), assembles them on one rank per pipeline stage, merges the
stages and writes once.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from nxd.parallel import ParallelContext, dim_size
from nxd_core_parallel.dtensor import copy_whole_
from nxd_modeling.hf_interop import (
    SafetensorsCheckpoint,
    SlicePiece,
    assembles_stage,
    check_config_fields,
    check_unused,
    exported_parameters,
    gather_pipeline_stages,
    gather_shards,
    loadable_parameters,
    place_piece,
    reading_headers_only,
    split_by_pieces,
    tp_size_and_rank,
    write_hf_dir,
    writes_files,
)

__all__ = ["HfFamilyIO", "HfMapping", "Piece", "collect_hf", "load_hf", "mapping_context", "save_hf"]


@dataclass(frozen=True)
class Piece:
    """Rows (``dim=0``) or columns (``dim=1``) ``index`` of HF tensor ``hf_key``; ``dim=None``: all
    of it. The concatenation of a parameter's pieces (along ``dim``) is one TP rank's shard."""

    hf_key: str
    dim: int | None
    index: tuple[int, ...] = ()
    #: stored transposed (GPT-2's ``Conv1D`` weights are ``[in, out]``)
    transpose: bool = False
    #: zero rows after ``index`` in the local shard (vocabulary padding; not in the checkpoint)
    zeros: int = 0

#: a shard (or expert matrix) with the HF pieces it is made of
Part = tuple[list[SlicePiece], torch.Tensor]


def _parameters(module: nn.Module, export: bool) -> Iterator[tuple[str, torch.Tensor]]:
    return exported_parameters(module) if export else loadable_parameters(module)


@dataclass(frozen=True)
class HfMapping:
    """A family's mapping between its parameters and Hugging Face tensors, at this run's TP size."""

    #: (nxd parameter name, TP rank) -> the HF pieces that make that rank's shard
    pieces: Callable[[str, int], list[SlicePiece]]
    #: every HF tensor's full shape
    shapes: Mapping[str, tuple[int, ...]]
    #: the ``config.json`` an export writes
    hf_config: Callable[[], dict]
    #: the model's parallel context (its TP/PP groups: who reads, gathers, assembles and writes)
    context: ParallelContext | None
    #: the output head is tied to the embedding (a checkpoint may still store ``lm_head.weight``)
    tied: bool = False
    #: HF key -> another spelling a checkpoint may store instead
    aliases: Mapping[str, str] | None = None
    #: checkpoint tensors nxd recomputes (never an "unused tensor" error)
    buffers: tuple[str, ...] = ("rotary_emb.inv_freq",)
    #: (module, export) -> the (name, tensor) pairs an import fills / an export assembles
    tensors: Callable[[nn.Module, bool], Iterator[tuple[str, torch.Tensor]]] = _parameters
    #: a parameter's local tensor read another way (experts stacked), or None for its pieces
    read: Callable[[SafetensorsCheckpoint, str, torch.Tensor, set[str]], torch.Tensor | None] | None = None
    #: a parameter gathered another way (experts over EP too; collective), or None for TP shards
    gather: Callable[[str, torch.Tensor], list[Part] | None] | None = None
    #: checkpoint keys other ranks read (another EP rank's experts), counted as used here
    read_elsewhere: Callable[[SafetensorsCheckpoint], set[str]] = field(default=lambda ckpt: set())


def mapping_context(module: nn.Module) -> ParallelContext | None:
    """The context a family's mapping shards by: the model's own once its plan has been applied,
    ``None`` while it is plain (:func:`nxd_tensor_parallel.tensor_plan.is_plain`: NxD's habit of loading
    weights inside ``model_fn``), so a plain model loads and exports whole tensors."""
    from nxd_tensor_parallel.tensor_plan import is_plain

    return None if is_plain(module) else module.parallel_context


@torch.no_grad()
def load_hf(module: nn.Module, hf_dir: str | os.PathLike, mapping: HfMapping, strict: bool = True) -> None:
    """Fill ``module``'s tensors from the HF directory; each rank reads only its slices. ``strict``:
    a checkpoint tensor no parameter uses is an error."""
    _, rank = tp_size_and_rank(mapping.context)
    used: set[str] = set()
    with SafetensorsCheckpoint(hf_dir, mapping.aliases) as ckpt:
        for name, param in mapping.tensors(module, False):
            tensor = mapping.read(ckpt, name, param, used) if mapping.read is not None else None
            if tensor is None:
                tensor = ckpt.read_pieces(mapping.pieces(name, rank), mapping.shapes, used)
            if tensor.shape != param.shape:
                raise ValueError(f"{name}: checkpoint slices give shape {list(tensor.shape)}, the parameter on TP rank "
                                 f"{rank} has {list(param.shape)}")
            if not reading_headers_only() or param.is_meta:  # a copy between meta tensors costs nothing
                copy_whole_(param, tensor)  # under FSDP this rank's rows of it
        used |= mapping.read_elsewhere(ckpt)
        if mapping.tied:
            used.add("lm_head.weight")  # some tied checkpoints still store it
        if reading_headers_only() and dim_size(mapping.context, "pp") > 1:
            return  # the other stages' reads are not known to one rank planned alone
        check_unused(ckpt, used, strict, context=mapping.context, buffers=mapping.buffers)


@torch.no_grad()
def collect_hf(module: nn.Module, mapping: HfMapping, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """The full HF-named state dict, gathered from every rank's shards and every pipeline stage
    (collective: every rank calls it); the tensors on the writing rank, an empty dict elsewhere."""
    context = mapping.context
    tp, _ = tp_size_and_rank(context)
    assembler = assembles_stage(context)  # of this pipeline stage's tensors
    out: dict[str, torch.Tensor] = {}
    for name, param in mapping.tensors(module, True):  # this stage's layers, under their global indices
        parts = mapping.gather(name, param) if mapping.gather is not None else None
        if parts is None:
            shards = gather_shards(param, tp, context)
            parts = [(mapping.pieces(name, r), shard) for r, shard in enumerate(shards)] if assembler else []
        if not assembler:
            continue
        for pieces, tensor in parts:
            for piece, chunk in zip(pieces, split_by_pieces(tensor, pieces)):
                place_piece(out, mapping.shapes[piece.hf_key], piece, chunk, dtype)
    out = gather_pipeline_stages(out, context)
    if writes_files(context) and set(out) != set(mapping.shapes):
        missing = sorted(set(mapping.shapes) - set(out))
        more = f" (+{len(missing) - 5} more)" if len(missing) > 5 else ""
        raise RuntimeError(f"export is missing HF tensors {missing[:5]}{more}")
    return out


def save_hf(module: nn.Module, out_dir: str | os.PathLike, mapping: HfMapping, dtype: torch.dtype | None = None,
            max_shard_size: int | None = None) -> None:
    """Write ``config.json`` + ``model.safetensors`` (shards + index above ``max_shard_size``
    bytes) that transformers loads. Collective over all ranks; one rank writes."""
    tensors = collect_hf(module, mapping, dtype)
    if tensors:
        write_hf_dir(out_dir, mapping.hf_config(), tensors, dtype, max_shard_size)
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


@dataclass(frozen=True)
class HfFamilyIO:
    """A family's ``load_hf_checkpoint`` / ``collect_hf_state_dict`` / ``save_hf_checkpoint``: its
    model unwrapping and mapping, run through the shared pipeline. ``options`` (e.g. GPT's
    ``layout``) go to ``mapping``."""

    #: model or NxDModel -> the family's model (a TypeError for another model)
    unwrap: Callable[[nn.Module], nn.Module]
    #: (unwrapped model, **options) -> its mapping at its context's TP size
    mapping: Callable[..., HfMapping]
    #: config fields a checkpoint's config.json must agree on with the model
    shape_fields: tuple[str, ...]
    #: the default for :meth:`save`'s ``max_shard_size`` (None: one file)
    max_shard_size: int | None = None

    def load(self, model: nn.Module, hf_dir: str | os.PathLike, strict: bool = True, **options: Any) -> None:
        module = self.unwrap(model)
        config = module.config
        check_config_fields(config, Path(hf_dir), type(config).from_dict, self.shape_fields)  # a subclass reads its own family
        load_hf(module, hf_dir, self.mapping(module, **options), strict)

    def collect(self, model: nn.Module, dtype: torch.dtype | None = None, **options: Any) -> dict[str, torch.Tensor]:
        module = self.unwrap(model)
        return collect_hf(module, self.mapping(module, **options), dtype)

    def save(self, model: nn.Module, out_dir: str | os.PathLike, dtype: torch.dtype | None = None,
             max_shard_size: int | None = None, **options: Any) -> None:
        module = self.unwrap(model)
        size = max_shard_size if max_shard_size is not None else self.max_shard_size
        save_hf(module, out_dir, self.mapping(module, **options), dtype, size)
