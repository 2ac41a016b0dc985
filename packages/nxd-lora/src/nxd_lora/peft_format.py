"""PEFT's adapter files: ``adapter_config.json`` + ``adapter_model.safetensors``.

Tensor keys are ``base_model.model.<HF module>.lora_A.weight`` (``[r, in]``) and ``...lora_B.weight``
(``[out, r]``) with Hugging Face module names: fused q/k/v and gate/up are written as separate
modules, TP shards are gathered, GQA KV replicas are written once. An adapted embedding is
``...lora_embedding_A`` (``[r, num_embeddings]``) / ``...lora_embedding_B`` (``[embedding_dim, r]``),
PEFT's names for its ``Embedding`` layer (no ``.weight``). Only configuration keys that
PEFT has long accepted are written, so older PEFT releases load the files too.

nxd's export also records both files' CRC-32 in ``nxd_checksums.json`` (as its Hugging Face export
does; PEFT ignores the file), and nxd checks them before it uses either file: a flipped byte in the
weights or in ``r``/``lora_alpha`` is refused naming the file. A folder without it (PEFT's own) is
read as it is.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from safetensors import SafetensorError
from safetensors.torch import load as safetensors_load
from safetensors.torch import save as safetensors_bytes

from nxd.errors import ConfigError
from nxd.parallel import dim_group, dim_size
from nxd_core_parallel.dtensor import copy_whole_, whole
from nxd_core_parallel.file_checksums import (
    MANIFEST,
    ChecksumError,
    check_digest,
    digest_of,
    read_manifest,
    write_manifest,
)
from nxd_lora.config import LoraConfig
from nxd_lora.naming import EMBEDDING_LAYERS, bias_pieces, model_spec_for, slots_for, tp_size_rank
from nxd_modeling.hf_interop import write_checked_file

CONFIG_NAME = "adapter_config.json"
WEIGHTS_NAME = "adapter_model.safetensors"
PREFIX = "base_model.model."

#: (key, dim or None, index) pieces that make up one local tensor, in local order
Pieces = list[tuple[str, int | None, tuple[int, ...]]]


# --------------------------------------------------------------------------- config
def peft_config_dict(config: LoraConfig, target_names: list[str], task_type: str | None = None) -> dict[str, Any]:
    """``adapter_config.json`` content for ``config`` (PEFT's key names only). ``task_type``:
    ``"CAUSAL_LM"`` for language models (PEFT then builds ``PeftModelForCausalLM``)."""
    targets = config.target_modules if isinstance(config.target_modules, str) else sorted(target_names)
    return {
        "peft_type": "LORA",
        "task_type": task_type,
        "base_model_name_or_path": config.base_model_name_or_path,
        "revision": None,
        "inference_mode": True,
        "r": config.lora_rank,
        "lora_alpha": config.lora_alpha,
        "lora_dropout": config.lora_dropout,
        "target_modules": targets,
        "bias": config.bias,
        "use_rslora": config.use_rslora,
        "init_lora_weights": True if config.init_lora_weights == "default" else "gaussian",
        "fan_in_fan_out": False,
        "modules_to_save": None,
        "layers_to_transform": None,
        "layers_pattern": None,
        "rank_pattern": {},
        "alpha_pattern": {},
        "use_dora": False,
    }


#: PEFT settings nxd-lora cannot reproduce: key -> values that are fine
_UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "use_dora": (False, None), "fan_in_fan_out": (False, None), "rank_pattern": ({}, None),
    "alpha_pattern": ({}, None), "layers_to_transform": (None, []), "modules_to_save": (None, []),
    "lora_bias": (False, None), "target_parameters": (None, []), "layer_replication": (None,),
    "exclude_modules": (None, []), "use_qalora": (False, None),
}


def read_checked(adapter_dir: Path, name: str) -> bytes:
    """The bytes of ``adapter_dir/name``, checked against the folder's ``nxd_checksums.json`` when nxd
    exported it (a folder from PEFT has none: read as it is)."""
    path = adapter_dir / name
    data = path.read_bytes()
    manifest = read_manifest(adapter_dir)
    if manifest is not None:
        if name not in manifest:
            raise ChecksumError(f"{path}: not among the files {adapter_dir / MANIFEST} records (added after the "
                                "export?); nothing was loaded from it")
        check_digest(digest_of(data), manifest[name], str(path), "nxd exported it")
    return data


def read_peft_config(adapter_dir: str | Path, **overrides: Any) -> LoraConfig:
    """A :class:`LoraConfig` from a PEFT (or nxd) ``adapter_config.json``."""
    path = Path(adapter_dir) / CONFIG_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no {CONFIG_NAME}; an adapter directory holds {CONFIG_NAME} and {WEIGHTS_NAME}")
    raw = read_checked(Path(adapter_dir), CONFIG_NAME)
    try:
        data = json.loads(raw)
    except ValueError as err:
        raise ConfigError(f"{path}: not valid JSON: {err}") from None
    if data.get("peft_type", "LORA") != "LORA":
        raise ConfigError(f"{path}: peft_type={data.get('peft_type')!r}; only LORA adapters are supported")
    for key, fine in _UNSUPPORTED.items():
        if key in data and data[key] not in fine:
            raise ConfigError(f"{path}: {key}={data[key]!r} is not supported by nxd-lora (supported: {fine[0]!r})")
    for key in ("r", "lora_alpha", "target_modules"):
        if key not in data:
            raise ConfigError(f"{path}: missing required key {key!r}")
    targets = data["target_modules"]
    init = data.get("init_lora_weights", True)
    fields = dict(
        enable_lora=True, lora_rank=data["r"], lora_alpha=data["lora_alpha"],
        lora_dropout=data.get("lora_dropout") or 0.0, bias=data.get("bias", "none"),
        target_modules=targets if isinstance(targets, str) else sorted(targets),
        use_rslora=bool(data.get("use_rslora", False)),
        init_lora_weights="gaussian" if init == "gaussian" else "default",
        base_model_name_or_path=data.get("base_model_name_or_path"),
    )
    fields.update(overrides)
    try:
        return LoraConfig(**fields)
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None


# --------------------------------------------------------------------------- gather / place
def _tp_gather(param: torch.Tensor, sharded: bool, tp: int, group: Any) -> list[torch.Tensor]:
    local = whole(param).detach().contiguous()  # FSDP: this TP rank's whole tensor from the DP shards
    if tp == 1 or not sharded:
        return [local] * tp
    shards = [torch.empty_like(local) for _ in range(tp)]
    dist.all_gather(shards, local, group=group)
    return shards


def _place(chunks: dict[str, list[tuple[int | None, tuple[int, ...], torch.Tensor]]], pieces: Pieces,
           shard: torch.Tensor) -> None:
    dim = pieces[0][1]
    sizes = [len(index) for _, _, index in pieces] if dim is not None else [shard.shape[0]]
    parts = shard.split(sizes, dim=dim) if len(pieces) > 1 else [shard]
    for (key, d, index), part in zip(pieces, parts):
        chunks.setdefault(key, []).append((d, index, part))


def _assemble(key: str, parts: list[tuple[int | None, tuple[int, ...], torch.Tensor]]) -> torch.Tensor:
    dim = parts[0][0]
    if dim is None:
        return parts[0][2].clone()
    size = 1 + max(i for _, index, _ in parts for i in index)
    shape = list(parts[0][2].shape)
    shape[dim] = size
    out = torch.zeros(shape, dtype=parts[0][2].dtype)
    seen = torch.zeros(size, dtype=torch.bool)
    for _, index, part in parts:
        idx = torch.tensor(index, dtype=torch.long)
        out.index_copy_(dim, idx, part.to(out.dtype).cpu())
        seen[idx] = True  # KV replicas write the same rows again: written once in the file
    if not bool(seen.all()):
        raise RuntimeError(f"{key}: TP shards do not cover rows/columns {torch.nonzero(~seen).flatten().tolist()[:8]}")
    return out


def adapter_key(hf_module: str, which: str, embedding: bool) -> str:
    """PEFT's file key of ``which`` (``"lora_A"``/``"lora_B"``) adapting ``hf_module``."""
    if embedding:
        return f"{PREFIX}{hf_module}.{which.replace('lora_', 'lora_embedding_')}"
    return f"{PREFIX}{hf_module}.{which}.weight"


def _lora_pieces(name: str, base: torch.nn.Module, plan: Any, tp: int, short: str, which: str
                 ) -> Callable[[int], Pieces]:
    def pieces(rank: int) -> Pieces:
        slot = next(s for s in slots_for(name, base, plan, tp, rank) if s.short_name == short)
        key = adapter_key(slot.hf_module, which, isinstance(base, EMBEDDING_LAYERS))
        sharded_dim = 1 if which == "lora_A" else 0
        if slot.dim == sharded_dim:
            return [(key, sharded_dim, slot.index)]
        return [(key, None, ())]

    return pieces


def _adapted_modules(lora_model: Any) -> set[str]:
    return {piece.slot.hf_module for _, adapter in lora_model.adapters().values() for piece in adapter.pieces.values()}


def _bias_key(hf_key: str, adapted: set[str]) -> str:
    """PEFT names the bias of an adapted module ``<module>.base_layer.bias``."""
    module, _, leaf = hf_key.rpartition(".")
    return f"{PREFIX}{module}.base_layer.{leaf}" if module in adapted else PREFIX + hf_key


def collect_adapter_state_dict(lora_model: Any) -> dict[str, torch.Tensor]:
    """Every adapter tensor under its PEFT key, gathered over TP (collective: every TP rank calls
    it). Returns the tensors on every rank (adapters are small)."""
    context = lora_model.parallel_context
    if dim_size(context, "pp") > 1:
        raise NotImplementedError("LoRA adapter export with pipeline parallelism is not supported yet (use PP=1)")
    tp, _ = tp_size_rank(context)
    group = dim_group(context, "tp")
    plan = lora_model.plan
    chunks: dict[str, list] = {}
    for name, (base, adapter) in sorted(lora_model.adapters().items()):
        for short, piece in adapter.pieces.items():
            for which, param in (("lora_A", piece.lora_A), ("lora_B", piece.lora_B)):
                pieces_of = _lora_pieces(name, base, plan, tp, short, which)
                sharded = bool(getattr(param, "tensor_model_parallel", False))
                for rank, shard in enumerate(_tp_gather(param, sharded, tp, group)):
                    _place(chunks, pieces_of(rank), shard)
    if lora_model.lora_config.bias != "none":
        adapted = _adapted_modules(lora_model)
        for pname, param in sorted(lora_model.module.named_parameters()):
            if not param.requires_grad:
                continue
            sharded = bool(getattr(param, "tensor_model_parallel", False))
            for rank, shard in enumerate(_tp_gather(param, sharded, tp, group)):
                pieces = [(_bias_key(k, adapted), d, i) for k, d, i in bias_pieces(pname, plan, tp, rank, param)]
                _place(chunks, pieces, shard)
    return {key: _assemble(key, parts) for key, parts in chunks.items()}


def target_names(lora_model: Any) -> list[str]:
    """HF short names of the adapted modules (PEFT's ``target_modules``)."""
    return sorted({short for _, adapter in lora_model.adapters().values() for short in adapter.pieces})


def _is_writer() -> bool:
    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


def save_adapter(lora_model: Any, out_dir: str | Path, embed_config: bool = False) -> Path:
    """Write ``adapter_config.json`` + ``adapter_model.safetensors`` (collective; global rank 0 writes)."""
    tensors = collect_adapter_state_dict(lora_model)
    out = Path(out_dir)
    task = "CAUSAL_LM" if model_spec_for(lora_model.module) is not None else None
    config = peft_config_dict(lora_model.lora_config, target_names(lora_model), task)
    if _is_writer():
        out.mkdir(parents=True, exist_ok=True)
        metadata = {"format": "pt"}
        if embed_config:
            metadata["nxd_lora_config"] = json.dumps(lora_model.lora_config.to_dict())
        (out / MANIFEST).unlink(missing_ok=True)  # an earlier export's: never left vouching for new files
        weights = safetensors_bytes({k: v.contiguous() for k, v in tensors.items()}, metadata=metadata)
        digests = {WEIGHTS_NAME: write_checked_file(out / WEIGHTS_NAME, weights),
                   CONFIG_NAME: write_checked_file(out / CONFIG_NAME, (json.dumps(config, indent=2) + "\n").encode())}
        write_manifest(out, digests, "nxd-lora adapter export")
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
    return out


# --------------------------------------------------------------------------- load
def _read_tensors(adapter_dir: Path) -> dict[str, torch.Tensor]:
    path = adapter_dir / WEIGHTS_NAME
    if path.is_file():
        try:
            return safetensors_load(read_checked(adapter_dir, WEIGHTS_NAME))
        except SafetensorError as exc:
            raise ValueError(f"{path}: not a readable safetensors file ({exc}); restore or re-export the "
                             "adapter") from None
    legacy = adapter_dir / "adapter_model.bin"
    if legacy.is_file():
        return torch.load(io.BytesIO(read_checked(adapter_dir, legacy.name)), map_location="cpu", weights_only=True)
    raise FileNotFoundError(f"{adapter_dir}: no {WEIGHTS_NAME} (or adapter_model.bin)")


def _normalise_key(key: str) -> str:
    # PEFT strips the adapter name on save; tolerate files that kept ".default".
    key = key.replace(".lora_A.default.", ".lora_A.").replace(".lora_B.default.", ".lora_B.")
    for tail in (".default", ".weight"):  # PEFT's embedding adapter tensors carry neither
        if key.endswith((f".lora_embedding_A{tail}", f".lora_embedding_B{tail}")):
            key = key[:-len(tail)]
    return key


def _load_saved_embedding(tensors: dict[str, torch.Tensor], name: str, base: torch.nn.Module, plan: Any, tp: int,
                          rank: int) -> list[str]:
    """PEFT saves an adapted embedding's base table too (``save_embedding_layers``, on by default
    for transformers models: ``<module>.base_layer.weight``) and loads it into the base: so does
    this (this rank's vocabulary rows)."""
    [slot] = slots_for(name, base, plan, tp, rank)
    key = f"{PREFIX}{slot.hf_module}.base_layer.weight"
    if key not in tensors:
        return []
    full = tensors[key]
    local = full if slot.dim is None else full.index_select(0, torch.tensor(slot.index, dtype=torch.long))
    if tuple(local.shape) != tuple(base.weight.shape):
        raise ValueError(f"{key} has shape {list(full.shape)}, which gives {list(local.shape)} on TP rank {rank}; "
                         f"the embedding here has {list(base.weight.shape)}")
    copy_whole_(base.weight, local)
    return [key]


@torch.no_grad()
def load_adapter_tensors(lora_model: Any, tensors: dict[str, torch.Tensor], where: str,
                         ) -> tuple[set[str], list[str]]:
    """Copy PEFT-keyed ``tensors`` (full, un-sharded) into ``lora_model``'s adapters, each rank its
    shard. Returns the keys used and the adapter keys ``tensors`` lacks (those adapters are left as
    they are). ``where`` names the source in errors."""
    tensors = {_normalise_key(k): v for k, v in tensors.items()}
    tp, rank = tp_size_rank(lora_model.parallel_context)
    plan = lora_model.plan
    used: set[str] = set()
    missing: list[str] = []
    for name, (base, adapter) in sorted(lora_model.adapters().items()):
        for short, piece in adapter.pieces.items():
            for which, param in (("lora_A", piece.lora_A), ("lora_B", piece.lora_B)):
                [(key, dim, index)] = _lora_pieces(name, base, plan, tp, short, which)(rank)
                if key not in tensors:
                    missing.append(key)
                    continue
                full = tensors[key]
                local = full if dim is None else full.index_select(dim, torch.tensor(index, dtype=torch.long))
                if tuple(local.shape) != tuple(param.shape):
                    raise ValueError(f"{where}: {key} has shape {list(full.shape)}, which gives "
                                     f"{list(local.shape)} on TP rank {rank}; the adapter here needs {list(param.shape)}")
                copy_whole_(param, local)
                used.add(key)
        if isinstance(base, EMBEDDING_LAYERS):
            used.update(_load_saved_embedding(tensors, name, base, plan, tp, rank))
    if lora_model.lora_config.bias != "none":
        adapted = _adapted_modules(lora_model)
        for pname, param in lora_model.module.named_parameters():
            if not param.requires_grad:
                continue
            parts = []
            pieces = bias_pieces(pname, plan, tp, rank, param)
            for key, dim, index in pieces:
                key = _bias_key(key, adapted) if _bias_key(key, adapted) in tensors else PREFIX + key
                if key not in tensors:
                    continue
                full = tensors[key]
                parts.append(full if dim is None else full.index_select(dim, torch.tensor(index, dtype=torch.long)))
                used.add(key)
            if parts and len(parts) == len(pieces):
                copy_whole_(param, torch.cat(parts, dim=pieces[0][1] or 0))
    return used, missing


def load_adapter(lora_model: Any, adapter_dir: str | Path, strict: bool = True) -> None:
    """Load PEFT adapter weights into ``lora_model``'s adapters (each rank takes its shard)."""
    adapter_dir = Path(adapter_dir)
    where = str(adapter_dir / WEIGHTS_NAME)
    tensors = {_normalise_key(k): v for k, v in _read_tensors(adapter_dir).items()}
    used, missing = load_adapter_tensors(lora_model, tensors, where)
    if missing:
        raise KeyError(f"{where}: missing {missing[0]} (the adapter's target_modules do not cover this layer)")
    leftover = sorted(set(tensors) - used)
    if leftover and strict:
        raise ValueError(f"{where}: tensors that match no adapter here: {leftover[:5]}"
                         f"{' ...' if len(leftover) > 5 else ''}; check target_modules, or pass strict=False")
