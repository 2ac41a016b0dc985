"""Model-agnostic helpers for Hugging Face checkpoint import/export under tensor and pipeline parallelism.

Each model package keeps its own name mapping (which HF rows/columns a TP rank holds); the reading
of safetensors slices, the gathering of shards, the gathering of pipeline stages and the choice of
the writing rank live here once.
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist
from safetensors import SafetensorError, safe_open
from safetensors.torch import save as safetensors_bytes
from torch import nn

from nxd.errors import NxdError
from nxd.parallel import ParallelContext, dim_group, dim_rank, dim_size
from nxd.paths import resolve_inside
from nxd_core_parallel.dtensor import whole
from nxd_core_parallel.file_checksums import (
    MANIFEST,
    check_digest,
    digest_of,
    file_digest,
    read_manifest,
    write_manifest,
)

__all__ = ["WRAPPER_TOKENS", "SafetensorsCheckpoint", "SlicePiece", "assembles_stage", "check_config_fields",
           "check_unused", "clean_param_name", "exported_parameters", "gather_over", "gather_pipeline_stages",
           "gather_shards", "headers_only", "loadable_parameters", "place_piece", "reading_headers_only", "split_by_pieces", "tp_size_and_rank",
           "unwrap_local_module", "write_checked_file", "write_hf_dir", "writes_files"]

class HfCheckpointError(NxdError, ValueError):
    """A Hugging Face checkpoint file nxd cannot use; the message names the file (and tensor)."""


def _unreadable(path: Path, exc: Exception, key: str | None = None) -> HfCheckpointError:
    tensor = f" (reading tensor {key!r})" if key else ""
    return HfCheckpointError(f"{path}: not a readable safetensors file{tensor}: {type(exc).__name__}: {exc}. It is "
                             "truncated or damaged: download or export that file again")


#: Wrapper prefixes (activation checkpointing, torch.compile, DDP-style) dropped from parameter names.
WRAPPER_TOKENS = ("_checkpoint_wrapped_module.", "_orig_mod.", "module.")


_HEADERS_ONLY: ContextVar[bool] = ContextVar("nxd_hf_headers_only", default=False)


@contextmanager
def headers_only() -> Iterator[None]:
    """Inside this block a load reads no tensor data: every tensor's name and shape is checked
    against the safetensors headers, parameters may be on the meta device and are left as they are
    (a rank's load planned before launch: ``nxd train --validate``)."""
    token = _HEADERS_ONLY.set(True)
    try:
        yield
    finally:
        _HEADERS_ONLY.reset(token)


def reading_headers_only() -> bool:
    """Whether loads only check headers (:func:`headers_only`)."""
    return _HEADERS_ONLY.get()


def clean_param_name(name: str) -> str:
    """``name`` without the wrapper prefixes of :data:`WRAPPER_TOKENS`."""
    for token in WRAPPER_TOKENS:
        name = name.replace(token, "")
    return name


def loadable_parameters(module: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """``module``'s parameters under their :func:`clean_param_name` names, for an importer to fill;
    a ``ValueError`` naming the first one still on the meta device."""
    for raw_name, param in module.named_parameters():
        name = clean_param_name(raw_name)
        if param.is_meta and not reading_headers_only():
            raise ValueError(f"parameter {name} is on the meta device: materialise the model before loading")
        yield name, param


def tp_size_and_rank(context: ParallelContext | None) -> tuple[int, int]:
    """(tensor-parallel size, this rank's tensor-parallel rank)."""
    return dim_size(context, "tp"), dim_rank(context, "tp")


class SlicePiece(Protocol):
    """What :meth:`SafetensorsCheckpoint.read` needs of a model's mapping piece: rows (``dim=0``) or
    columns (``dim=1``) ``index`` of ``hf_key`` (``dim=None``: all of it); optional ``zeros`` (TP
    padding rows appended) and ``transpose``."""

    hf_key: str
    dim: int | None
    index: tuple[int, ...]


class SafetensorsCheckpoint:
    """Read slices of tensors from ``model.safetensors`` or a sharded ``model.safetensors.index.json``.

    ``aliases``: HF key -> another spelling accepted when the checkpoint stores only that one."""

    def __init__(self, hf_dir: str | os.PathLike, aliases: Mapping[str, str] | None = None) -> None:
        self.dir = Path(hf_dir)
        self.aliases = dict(aliases or {})
        #: the checksums nxd's export recorded (None: a folder from elsewhere, read as it is)
        self._manifest = read_manifest(self.dir)
        self._verified: set[Path] = set()
        index, single = self.dir / "model.safetensors.index.json", self.dir / "model.safetensors"
        if index.is_file():
            self._verify(index)
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
                if not isinstance(weight_map, dict):
                    raise ValueError("'weight_map' is not an object")
            except (ValueError, KeyError, TypeError) as err:
                raise HfCheckpointError(f"{index}: not a safetensors index (needs a 'weight_map' object): {err}") from None
            # every file the index names stays inside the model folder (nxd.paths): never '../x' or '/x'
            self.files = {key: Path(resolve_inside(str(self.dir), name, f"{index}: weight_map[{key!r}]"))
                          for key, name in weight_map.items()}
        elif single.is_file():
            self._verify(single)
            try:
                with safe_open(str(single), framework="pt") as f:
                    self.files = {key: single for key in f.keys()}
            except SafetensorError as exc:
                raise _unreadable(single, exc) from None
        else:
            found = sorted(p.name for p in self.dir.iterdir()) if self.dir.is_dir() else "no such directory"
            raise FileNotFoundError(
                f"{self.dir}: no model.safetensors or model.safetensors.index.json (found: {found}); "
                "convert .bin checkpoints to safetensors first"
            )
        self._stack = ExitStack()
        self._handles: dict[Path, Any] = {}

    def _verify(self, path: Path) -> None:
        """Check ``path`` against the export's manifest before any of it is used (once per file)."""
        if self._manifest is None or path in self._verified or reading_headers_only():  # headers: no data read
            return
        name = os.path.relpath(path, self.dir)
        if name not in self._manifest:
            raise HfCheckpointError(f"{path}: not among the files {self.dir / MANIFEST} records (added after the "
                                    "export?); nothing was loaded from it")
        others = {str(self.dir / n): d for n, d in self._manifest.items() if n != name}
        check_digest(file_digest(path), self._manifest[name], str(path), "nxd exported it", others)
        self._verified.add(path)

    def __enter__(self) -> SafetensorsCheckpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def keys(self) -> set[str]:
        return set(self.files)

    def resolve(self, key: str) -> str:
        """``key`` as stored (an accepted alias when the checkpoint spells it differently)."""
        alias = self.aliases.get(key)
        return alias if key not in self.files and alias in self.files else key

    def _slice(self, key: str) -> Any:
        key = self.resolve(key)
        if key not in self.files:
            raise KeyError(f"{self.dir}: tensor {key!r} is missing from the checkpoint")
        path = self.files[key]
        if path not in self._handles:
            if not path.is_file():
                raise FileNotFoundError(f"{path}: listed in the index for {key!r} but missing")
            self._verify(path)
            try:
                self._handles[path] = self._stack.enter_context(safe_open(str(path), framework="pt"))
            except SafetensorError as exc:
                raise _unreadable(path, exc, key) from None
        try:
            return self._handles[path].get_slice(key)
        except SafetensorError as exc:
            raise _unreadable(path, exc, key) from None

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self._slice(key).get_shape())

    def read(self, piece: SlicePiece) -> torch.Tensor:
        """Only the span of rows/columns ``piece`` names is read from disk (transposed if it says so);
        under :func:`headers_only`, a meta tensor of the shape the read would give."""
        if reading_headers_only():
            return self._planned(piece)
        try:
            return self._read(piece)
        except SafetensorError as exc:
            raise _unreadable(self.files.get(self.resolve(piece.hf_key), self.dir), exc, piece.hf_key) from None

    def _read(self, piece: SlicePiece) -> torch.Tensor:
        sl = self._slice(piece.hf_key)
        if piece.dim is None:
            return sl[:].t() if getattr(piece, "transpose", False) else sl[:]
        if not piece.index:  # a shard that is all TP padding
            block = sl[0:0] if piece.dim == 0 else sl[:, 0:0]
        else:
            lo, hi = min(piece.index), max(piece.index) + 1
            block = sl[lo:hi] if piece.dim == 0 else sl[:, lo:hi]
            if tuple(piece.index) != tuple(range(lo, hi)):
                block = block.index_select(piece.dim, torch.tensor(piece.index) - lo)
        zeros = getattr(piece, "zeros", 0)
        if zeros:  # TP padding rows after the real ones (a pad=True layer's vocabulary)
            shape = list(block.shape)
            shape[piece.dim] = zeros
            block = torch.cat([block, block.new_zeros(shape)], dim=piece.dim)
        return block.t() if getattr(piece, "transpose", False) else block


    def _planned(self, piece: SlicePiece) -> torch.Tensor:
        shape = list(self.shape(piece.hf_key))
        if piece.dim is not None:
            if piece.index and max(piece.index) >= shape[piece.dim]:
                raise ValueError(f"{self.dir}: {piece.hf_key} has {shape[piece.dim]} entries along dim {piece.dim}, "
                                 f"this rank reads up to index {max(piece.index)}")
            shape[piece.dim] = len(piece.index) + getattr(piece, "zeros", 0)
        if getattr(piece, "transpose", False):
            shape.reverse()
        return torch.empty(shape, device="meta")

    def read_pieces(self, pieces: list[SlicePiece], expected: Mapping[str, tuple[int, ...]], used: set[str]
                    ) -> torch.Tensor:
        """The tensor ``pieces`` make up (concatenated along their ``dim``). Each HF tensor's full
        shape must be ``expected[hf_key]`` (a ``ValueError`` naming it otherwise); its key is added
        to ``used`` (for :func:`check_unused`)."""
        parts = []
        for piece in pieces:
            shape = self.shape(piece.hf_key)
            if shape != tuple(expected[piece.hf_key]):
                raise ValueError(f"{self.dir}: {piece.hf_key} has shape {list(shape)}, expected "
                                 f"{list(expected[piece.hf_key])} for this config")
            parts.append(self.read(piece))
            used.add(self.resolve(piece.hf_key))  # as stored: check_unused compares stored names
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=pieces[0].dim)


def check_unused(ckpt: SafetensorsCheckpoint, used: set[str], strict: bool, *, context: ParallelContext | None,
                 buffers: tuple[str, ...] = ("rotary_emb.inv_freq",)) -> None:
    """With ``strict``, a ``ValueError`` naming the checkpoint tensors no parameter read (names
    ending in one of ``buffers``, tensors HF stores but nxd recomputes, excepted). Under pipeline
    parallelism the tensors every stage read count (collective over the pipeline group)."""
    used = _union_over_pipeline(used, context)
    leftover = sorted(k for k in ckpt.keys() - used if not k.endswith(buffers))
    if leftover and strict:
        more = f" (+{len(leftover) - 5} more)" if len(leftover) > 5 else ""
        raise ValueError(f"{ckpt.dir}: tensors not used by the model: {leftover[:5]}{more}; pass strict=False to "
                         "ignore them")


def split_by_pieces(shard: torch.Tensor, pieces: list[SlicePiece]) -> list[torch.Tensor]:
    """A TP rank's ``shard`` cut into the parts its ``pieces`` name (TP padding rows included)."""
    if len(pieces) == 1 or pieces[0].dim is None:
        return [shard]
    return list(shard.split([len(p.index) + getattr(p, "zeros", 0) for p in pieces], dim=pieces[0].dim))


def place_piece(out: dict[str, torch.Tensor], shape: tuple[int, ...], piece: SlicePiece, chunk: torch.Tensor,
                dtype: torch.dtype | None = None) -> None:
    """Write ``chunk`` (the part of a shard ``piece`` names) into the full HF tensor
    ``out[piece.hf_key]``, created with ``shape`` and ``dtype`` (default: the chunk's) on first use;
    TP padding rows (``piece.zeros``) are dropped, a ``piece.transpose`` chunk is transposed back."""
    if getattr(piece, "transpose", False):  # stored transposed (GPT-2's Conv1D): piece.dim is the HF one
        chunk = chunk.t()
    zeros = getattr(piece, "zeros", 0)
    if zeros:
        chunk = chunk.narrow(piece.dim, 0, len(piece.index))
    target = out.get(piece.hf_key)
    if target is None:
        target = out[piece.hf_key] = torch.empty(shape, dtype=dtype or chunk.dtype)
    if piece.dim is None:
        target.copy_(chunk)
    elif piece.index:
        target.index_copy_(piece.dim, torch.tensor(piece.index), chunk.to(target.dtype))


def gather_over(tensor: torch.Tensor, size: int, group: object) -> list[torch.Tensor]:
    """``tensor`` of every rank of ``group`` (``size`` ranks), in rank order."""
    local = tensor.detach().contiguous()
    if size == 1:
        return [local]
    shards = [torch.empty_like(local) for _ in range(size)]
    dist.all_gather(shards, local, group=group)
    return shards


def gather_shards(param: torch.Tensor, tp: int, context: ParallelContext | None) -> list[torch.Tensor]:
    """Every TP rank's shard of ``param`` (the same tensor ``tp`` times when it is replicated); a
    parameter FSDP sharded is gathered over its data-parallel shards first."""
    local = whole(param).detach().contiguous()
    if tp == 1 or not getattr(param, "tensor_model_parallel", False):
        return [local] * tp
    return gather_over(local, tp, dim_group(context, "tp"))


def exported_parameters(module: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """``module``'s parameters under their :func:`clean_param_name` names, for an exporter to
    assemble; the copy of a tied weight that a later pipeline stage keeps (nxd-pipeline marks it
    ``pipeline_shared_duplicate``) is left out, its first owner exports it."""
    for raw_name, param in module.named_parameters():
        if not getattr(param, "pipeline_shared_duplicate", False):
            yield clean_param_name(raw_name), param


def _union_over_pipeline(keys: set[str], context: ParallelContext | None) -> set[str]:
    pp = dim_size(context, "pp")
    if pp == 1:
        return keys
    parts: list[Any] = [None] * pp
    dist.all_gather_object(parts, sorted(keys), group=context.pp.group)
    return set().union(*parts)


def assembles_stage(context: ParallelContext | None) -> bool:
    """True on the one rank per pipeline stage that assembles the stage's HF tensors from its TP
    (and EP) shards: TP rank 0 of DP rank 0 and context-parallel rank 0 (CP ranks hold the same
    weights). Without pipeline parallelism it is the writing rank."""
    if not (dist.is_available() and dist.is_initialized()):
        return True
    if context is None:
        return dist.get_rank() == 0
    return dist.get_rank() == context.tp.src_rank and context.dp.rank == 0 and context.cp.rank == 0


def writes_files(context: ParallelContext | None) -> bool:
    """True on the one rank that writes exported files: the assembler (:func:`assembles_stage`)
    of pipeline stage 0, global rank 0 in NxD's rank layout."""
    return assembles_stage(context) and dim_rank(context, "pp") == 0


def gather_pipeline_stages(tensors: dict[str, torch.Tensor], context: ParallelContext | None) -> dict[str, torch.Tensor]:
    """Every pipeline stage's HF tensors merged on pipeline rank 0 (collective over the pipeline
    group: every rank calls it, each stage's assembler with the tensors of the layers it owns, the
    others with an empty dict); an empty dict on the other ranks. Without pipeline parallelism
    ``tensors`` comes back as it is. A key exported by two stages is a ``RuntimeError``."""
    pp, pp_rank = dim_size(context, "pp"), dim_rank(context, "pp")
    if pp == 1:
        return tensors
    group, ranks = context.pp.group, context.pp.ranks
    local = {key: value.detach().cpu() for key, value in tensors.items()}
    if pp_rank != 0:
        dist.send_object_list([local], dst=ranks[0], group=group)
        return {}
    # one stage at a time: the writer holds the model plus one stage in transit, not every stage's copy
    merged, owner = local, dict.fromkeys(local, 0)
    clash = None
    for stage in range(1, pp):  # every stage is received before an error, so no sender is left waiting
        box: list[Any] = [None]
        dist.recv_object_list(box, src=ranks[stage], group=group)
        for key, value in box[0].items():
            if key in merged:
                clash = clash or f"HF tensor {key} is exported by pipeline stages {owner[key]} and {stage}"
            merged[key], owner[key] = value, stage
    if clash:
        raise RuntimeError(f"{clash}; each tensor must belong to one stage")
    return merged


def unwrap_local_module(model: nn.Module, config_type: type, expected: str) -> nn.Module:
    """The model inside an ``NxDModel`` (or ``model`` itself); a ``TypeError`` naming ``expected``
    unless its ``config`` is a ``config_type``."""
    if hasattr(model, "local_module") and callable(model.local_module):
        model = model.local_module()
    if not isinstance(getattr(model, "config", None), config_type):
        raise TypeError(f"expected an nxd {expected} (or NxDModel wrapping one), got {type(model).__name__}")
    return model


def check_config_fields(model_config: object, hf_dir: Path, from_dict: Callable[[dict], object],
                        fields: tuple[str, ...]) -> None:
    """Each of ``fields`` of ``hf_dir/config.json`` (read by ``from_dict``) equals ``model_config``'s;
    a weights-only directory passes (shapes are still checked tensor by tensor)."""
    path = hf_dir / "config.json"
    if not path.is_file():
        return
    ckpt_config = from_dict(json.loads(path.read_text()))
    for name in fields:
        if getattr(ckpt_config, name) != getattr(model_config, name):
            raise ValueError(f"{path}: {name}={getattr(ckpt_config, name)!r} but the model was built with "
                             f"{name}={getattr(model_config, name)!r}")


def write_hf_dir(out_dir: str | os.PathLike, hf_config: dict, tensors: dict[str, torch.Tensor],
                 dtype: torch.dtype | None = None, max_shard_size: int | None = None) -> None:
    """Write ``config.json`` (``torch_dtype`` set when ``dtype`` is given) and the tensors: one
    ``model.safetensors``, or shards + index when they exceed ``max_shard_size`` bytes."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if dtype is not None:
        hf_config = {**hf_config, "torch_dtype": str(dtype).replace("torch.", "")}
    (out / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for key in sorted(tensors):
        nbytes = tensors[key].numel() * tensors[key].element_size()
        if max_shard_size is not None and shards[-1] and size + nbytes > max_shard_size:
            shards.append({})
            size = 0
        shards[-1][key] = tensors[key].contiguous()
        size += nbytes
    metadata = {"format": "pt"}
    (out / MANIFEST).unlink(missing_ok=True)  # an earlier export's: never left vouching for new files
    digests: dict[str, dict] = {}
    if len(shards) == 1:
        digests["model.safetensors"] = write_checked_file(out / "model.safetensors", safetensors_bytes(shards[0], metadata))
    else:
        weight_map = {}
        for i, shard in enumerate(shards, start=1):
            name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
            digests[name] = write_checked_file(out / name, safetensors_bytes(shard, metadata))
            weight_map.update({key: name for key in shard})
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        digests["model.safetensors.index.json"] = write_checked_file(out / "model.safetensors.index.json",
                                                              (json.dumps(index, indent=2) + "\n").encode())
    try:  # what transformers reads ignores it; nxd checks every file against it before loading one
        write_manifest(out, digests, "nxd hf export")
    except OSError as exc:
        raise _write_failed(out / MANIFEST, exc) from None


def _write_failed(path: Path, exc: OSError) -> HfCheckpointError:
    full = exc.errno == errno.ENOSPC or "os error 28" in str(exc)
    why = "no space left on device" if full else f"{type(exc).__name__}: {exc}"
    return HfCheckpointError(f"writing {path} failed: {why}; the export in {path.parent} is incomplete: free space "
                             "or choose another --output, then export again")


def write_checked_file(path: Path, data: bytes) -> dict:
    """Write ``data`` (hashed in memory as it goes out: no second read) and return its checksum (for
    the folder's ``nxd_checksums.json``); a failure names the file."""
    try:
        with open(path, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        raise _write_failed(path, exc) from None
    return digest_of(data)
