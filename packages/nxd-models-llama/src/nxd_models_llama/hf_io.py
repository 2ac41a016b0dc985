"""Hugging Face checkpoint import (each TP rank reads only its slices) and export."""

from __future__ import annotations

import json
import os
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from nxd_core_parallel import parallel_state
from nxd_models_llama.config import LlamaConfig
from nxd_models_llama.hf_mapping import Piece, hf_shapes, plan_for

#: Config fields that must agree between a checkpoint and the model it is loaded into.
_SHAPE_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "head_dim", "tie_word_embeddings", "attention_bias", "mlp_bias")
#: Wrapper prefixes (activation checkpointing, torch.compile, DDP-style) dropped from names.
_WRAPPER_TOKENS = ("_checkpoint_wrapped_module.", "_orig_mod.", "module.")


def unwrap_model(model: nn.Module) -> nn.Module:
    """The :class:`LlamaForCausalLM` inside an ``NxDModel`` (or the model itself)."""
    if hasattr(model, "local_module") and callable(model.local_module):
        model = model.local_module()
    if not hasattr(model, "config") or not isinstance(model.config, LlamaConfig):
        raise TypeError(f"expected an nxd LlamaForCausalLM (or NxDModel wrapping one), got {type(model).__name__}")
    return model


def _clean(name: str) -> str:
    for token in _WRAPPER_TOKENS:
        name = name.replace(token, "")
    return name


def _tp() -> tuple[int, int]:
    return parallel_state.get_tensor_model_parallel_size(), parallel_state.get_tensor_model_parallel_rank()


def _kv_multiplier(model: nn.Module) -> int:
    return model.model.layers[0].self_attn.kv_size_multiplier if len(model.model.layers) else 1


class SafetensorsCheckpoint:
    """Read slices of tensors from ``model.safetensors`` or a sharded ``model.safetensors.index.json``."""

    def __init__(self, hf_dir: str | os.PathLike) -> None:
        self.dir = Path(hf_dir)
        index, single = self.dir / "model.safetensors.index.json", self.dir / "model.safetensors"
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (ValueError, KeyError) as err:
                raise ValueError(f"{index}: not a safetensors index (needs a 'weight_map' object): {err}") from None
            self.files = {key: self.dir / name for key, name in weight_map.items()}
        elif single.is_file():
            with safe_open(str(single), framework="pt") as f:
                self.files = {key: single for key in f.keys()}
        else:
            found = sorted(p.name for p in self.dir.iterdir()) if self.dir.is_dir() else "no such directory"
            raise FileNotFoundError(
                f"{self.dir}: no model.safetensors or model.safetensors.index.json (found: {found}); "
                "convert .bin checkpoints to safetensors first"
            )
        self._stack = ExitStack()
        self._handles: dict[Path, Any] = {}

    def __enter__(self) -> SafetensorsCheckpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def keys(self) -> set[str]:
        return set(self.files)

    def _slice(self, key: str) -> Any:
        if key not in self.files:
            raise KeyError(f"{self.dir}: tensor {key!r} is missing from the checkpoint")
        path = self.files[key]
        if path not in self._handles:
            if not path.is_file():
                raise FileNotFoundError(f"{path}: listed in the index for {key!r} but missing")
            self._handles[path] = self._stack.enter_context(safe_open(str(path), framework="pt"))
        return self._handles[path].get_slice(key)

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self._slice(key).get_shape())

    def read(self, piece: Piece) -> torch.Tensor:
        """Only the rows/columns ``piece`` names are read from disk (one contiguous span)."""
        sl = self._slice(piece.hf_key)
        if piece.dim is None:
            return sl[:]
        if piece.zeros:  # TP padding rows after the real ones
            real = self.read(Piece(piece.hf_key, piece.dim, piece.index))
            shape = list(real.shape)
            shape[piece.dim] = piece.zeros
            return torch.cat([real, real.new_zeros(shape)], dim=piece.dim)
        if not piece.index:  # a shard that is all padding
            return sl[0:0] if piece.dim == 0 else sl[:, 0:0]
        lo, hi = min(piece.index), max(piece.index) + 1
        block = sl[lo:hi] if piece.dim == 0 else sl[:, lo:hi]
        if len(piece.index) == hi - lo and piece.index == tuple(range(lo, hi)):
            return block
        return block.index_select(piece.dim, torch.tensor(piece.index) - lo)


def _check_config(model_config: LlamaConfig, hf_dir: Path) -> None:
    path = hf_dir / "config.json"
    if not path.is_file():
        return  # weights-only directory: shapes are still checked tensor by tensor
    ckpt_config = LlamaConfig.from_dict(json.loads(path.read_text()))
    for name in _SHAPE_FIELDS:
        if getattr(ckpt_config, name) != getattr(model_config, name):
            raise ValueError(f"{path}: {name}={getattr(ckpt_config, name)!r} but the model was built with "
                             f"{name}={getattr(model_config, name)!r}")


@torch.no_grad()
def load_hf_checkpoint(model: nn.Module, hf_dir: str | os.PathLike, strict: bool = True) -> None:
    """Load a Hugging Face Llama directory into ``model`` at the current TP degree.

    Each rank opens the safetensors files and reads only the slices its shards need. ``strict``:
    checkpoint tensors the model does not use are an error (rotary ``inv_freq`` buffers excepted).
    """
    module = unwrap_model(model)
    config, hf_dir = module.config, Path(hf_dir)
    _check_config(config, hf_dir)
    tp, rank = _tp()
    multiplier = _kv_multiplier(module)
    expected = hf_shapes(config)
    used: set[str] = set()
    with SafetensorsCheckpoint(hf_dir) as ckpt:
        for raw_name, param in module.named_parameters():
            name = _clean(raw_name)
            if param.is_meta:
                raise ValueError(f"parameter {name} is on the meta device: materialise the model before loading")
            pieces = plan_for(name, config, tp, rank, multiplier)
            parts = []
            for piece in pieces:
                shape = ckpt.shape(piece.hf_key)
                if shape != expected[piece.hf_key]:
                    raise ValueError(f"{hf_dir}: {piece.hf_key} has shape {list(shape)}, expected "
                                     f"{list(expected[piece.hf_key])} for this config")
                parts.append(ckpt.read(piece))
                used.add(piece.hf_key)
            tensor = parts[0] if len(parts) == 1 else torch.cat(parts, dim=pieces[0].dim)
            if tensor.shape != param.shape:
                raise ValueError(f"{name}: checkpoint slices give shape {list(tensor.shape)}, the parameter on TP rank "
                                 f"{rank} has {list(param.shape)}")
            param.copy_(tensor.to(param.dtype))
        if config.tie_word_embeddings:
            used.add("lm_head.weight")  # some tied checkpoints still store it
        leftover = sorted(k for k in ckpt.keys() - used if not k.endswith("rotary_emb.inv_freq"))
        if leftover and strict:
            more = f" (+{len(leftover) - 5} more)" if len(leftover) > 5 else ""
            raise ValueError(f"{hf_dir}: tensors not used by the model: {leftover[:5]}{more}; pass strict=False to "
                             "ignore them")


def _gather_shards(param: torch.Tensor, tp: int) -> list[torch.Tensor]:
    """Every TP rank's shard of ``param`` (the same tensor ``tp`` times when it is replicated)."""
    local = param.detach().contiguous()
    if tp == 1 or not getattr(param, "tensor_model_parallel", False):
        return [local] * tp
    shards = [torch.empty_like(local) for _ in range(tp)]
    dist.all_gather(shards, local, group=parallel_state.get_tensor_model_parallel_group())
    return shards


def _writes_files() -> bool:
    if not (dist.is_available() and dist.is_initialized()):
        return True
    if not parallel_state.model_parallel_is_initialized():
        return dist.get_rank() == 0
    return dist.get_rank() == parallel_state.get_tensor_model_parallel_src_rank() and \
        parallel_state.get_data_parallel_rank() == 0


@torch.no_grad()
def collect_hf_state_dict(model: nn.Module, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """The full HF-named state dict, assembled from all TP ranks (collective: every TP rank calls it).

    Returns the tensors on the rank that writes files and an empty dict elsewhere."""
    module = unwrap_model(model)
    config = module.config
    if parallel_state.model_parallel_is_initialized() and parallel_state.get_pipeline_model_parallel_size() > 1:
        raise NotImplementedError("save_hf_checkpoint with pipeline parallelism: gather the stages first")
    tp, _ = _tp()
    multiplier = _kv_multiplier(module)
    writer = _writes_files()
    shapes = hf_shapes(config)
    out: dict[str, torch.Tensor] = {}
    for raw_name, param in module.named_parameters():
        name = _clean(raw_name)
        shards = _gather_shards(param, tp)
        if not writer:
            continue
        for r, shard in enumerate(shards):
            pieces = plan_for(name, config, tp, r, multiplier)
            sizes = [len(p.index) + p.zeros for p in pieces] if pieces[0].dim is not None else [shard.shape[0]]
            chunks = shard.split(sizes, dim=pieces[0].dim or 0) if len(pieces) > 1 else [shard]
            for piece, chunk in zip(pieces, chunks):
                if piece.zeros:  # TP padding rows: not part of the HF tensor
                    chunk = chunk.narrow(piece.dim, 0, len(piece.index))
                target_dtype = dtype or param.dtype
                if piece.hf_key not in out:
                    out[piece.hf_key] = torch.empty(shapes[piece.hf_key], dtype=target_dtype)
                if piece.dim is None:
                    out[piece.hf_key].copy_(chunk)
                elif piece.index:
                    out[piece.hf_key].index_copy_(piece.dim, torch.tensor(piece.index), chunk.to(target_dtype))
    if writer and set(out) != set(shapes):
        raise RuntimeError(f"export is missing HF tensors {sorted(set(shapes) - set(out))}")
    return out


def save_hf_checkpoint(model: nn.Module, out_dir: str | os.PathLike, dtype: torch.dtype | None = None,
                       max_shard_size: int = 5 * 2**30) -> None:
    """Write ``config.json`` + ``model.safetensors`` (or shards + index) that
    ``transformers.LlamaForCausalLM.from_pretrained`` loads. Collective over TP; one rank writes."""
    module = unwrap_model(model)
    tensors = collect_hf_state_dict(module, dtype)
    if tensors:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        hf_config = module.config.to_hf_dict()
        if dtype is not None:
            hf_config["torch_dtype"] = str(dtype).replace("torch.", "")
        (out / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
        _write_safetensors(tensors, out, max_shard_size)
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _write_safetensors(tensors: dict[str, torch.Tensor], out: Path, max_shard_size: int) -> None:
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for key in sorted(tensors):
        nbytes = tensors[key].numel() * tensors[key].element_size()
        if shards[-1] and size + nbytes > max_shard_size:
            shards.append({})
            size = 0
        shards[-1][key] = tensors[key].contiguous()
        size += nbytes
    metadata = {"format": "pt"}
    if len(shards) == 1:
        save_file(shards[0], str(out / "model.safetensors"), metadata=metadata)
        return
    weight_map = {}
    for i, shard in enumerate(shards, start=1):
        name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(out / name), metadata=metadata)
        weight_map.update({key: name for key in shard})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
