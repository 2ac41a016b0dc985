"""Hugging Face GPT-2 / GPT-NeoX checkpoint import (each TP rank reads only its slices) and export."""

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
#: Wrapper prefixes (activation checkpointing, torch.compile, DDP-style) dropped from names.
_WRAPPER_TOKENS = ("_checkpoint_wrapped_module.", "_orig_mod.", "module.")


def unwrap_model(model: nn.Module) -> nn.Module:
    """The :class:`GPTForCausalLM` inside an ``NxDModel`` (or the model itself)."""
    if hasattr(model, "local_module") and callable(model.local_module):
        model = model.local_module()
    if not isinstance(getattr(model, "config", None), GPTConfig):
        raise TypeError(f"expected an nxd GPTForCausalLM (or NxDModel wrapping one), got {type(model).__name__}")
    return model


def clean_name(name: str) -> str:
    for token in _WRAPPER_TOKENS:
        name = name.replace(token, "")
    return name


def _tp() -> tuple[int, int]:
    return parallel_state.get_tensor_model_parallel_size(), parallel_state.get_tensor_model_parallel_rank()


class SafetensorsCheckpoint:
    """Slices of tensors from ``model.safetensors`` or a sharded ``model.safetensors.index.json``."""

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
            raise FileNotFoundError(f"{self.dir}: no model.safetensors or model.safetensors.index.json (found: "
                                    f"{found}); convert .bin checkpoints to safetensors first")
        self._stack = ExitStack()
        self._handles: dict[Path, Any] = {}

    def __enter__(self) -> SafetensorsCheckpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def keys(self) -> set[str]:
        return set(self.files)

    def resolve(self, key: str) -> str:
        """``key`` as stored (an accepted alias when the checkpoint spells it differently)."""
        alias = HF_KEY_ALIASES.get(key)
        return alias if key not in self.files and alias in self.files else key

    def _slice(self, key: str) -> Any:
        key = self.resolve(key)
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
        """Only the span of rows/columns ``piece`` names is read from disk."""
        sl = self._slice(piece.hf_key)
        if piece.dim is None:
            return sl[:]
        lo, hi = min(piece.index), max(piece.index) + 1
        block = sl[lo:hi] if piece.dim == 0 else sl[:, lo:hi]
        if piece.index != tuple(range(lo, hi)):
            block = block.index_select(piece.dim, torch.tensor(piece.index) - lo)
        return block.t() if piece.transpose else block


def _check_config(model_config: GPTConfig, hf_dir: Path) -> None:
    path = hf_dir / "config.json"
    if not path.is_file():
        return  # weights-only directory: shapes are still checked tensor by tensor
    ckpt_config = GPTConfig.from_dict(json.loads(path.read_text()))
    for name in _SHAPE_FIELDS:
        if getattr(ckpt_config, name) != getattr(model_config, name):
            raise ValueError(f"{path}: {name}={getattr(ckpt_config, name)!r} but the model was built with "
                             f"{name}={getattr(model_config, name)!r}")


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
    config, hf_dir = module.config, Path(hf_dir)
    _check_config(config, hf_dir)
    if layout is None:
        cfg_path = hf_dir / "config.json"
        model_type = json.loads(cfg_path.read_text()).get("model_type") if cfg_path.is_file() else None
        layout = {"gpt2": "gpt2", "gpt_neox": "gpt_neox"}.get(model_type) or default_layout(config)
    check_exportable(config, layout)
    tp, rank = _tp()
    expected = hf_shapes(config, layout)
    used: set[str] = set()
    with SafetensorsCheckpoint(hf_dir) as ckpt:
        for raw_name, param in module.named_parameters():
            name = clean_name(raw_name)
            if param.is_meta:
                raise ValueError(f"parameter {name} is on the meta device: materialise the model before loading")
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
        leftover = sorted(k for k in ckpt.keys() - used
                          if not k.endswith(("rotary_emb.inv_freq", "attn.bias", "attn.masked_bias",
                                             "attention.bias", "attention.masked_bias")))
        if leftover and strict:
            more = f" (+{len(leftover) - 5} more)" if len(leftover) > 5 else ""
            raise ValueError(f"{hf_dir}: tensors not used by the model: {leftover[:5]}{more}; pass strict=False "
                             "to ignore them")


def gather_shards(param: torch.Tensor, tp: int) -> list[torch.Tensor]:
    """Every TP rank's shard of ``param`` (the same tensor ``tp`` times when it is replicated)."""
    local = param.detach().contiguous()
    if tp == 1 or not getattr(param, "tensor_model_parallel", False):
        return [local] * tp
    shards = [torch.empty_like(local) for _ in range(tp)]
    dist.all_gather(shards, local, group=parallel_state.get_tensor_model_parallel_group())
    return shards


def writes_files() -> bool:
    """True on the one rank that writes exported files (TP rank 0 of DP rank 0)."""
    if not (dist.is_available() and dist.is_initialized()):
        return True
    if not parallel_state.model_parallel_is_initialized():
        return dist.get_rank() == 0
    return dist.get_rank() == parallel_state.get_tensor_model_parallel_src_rank() and \
        parallel_state.get_data_parallel_rank() == 0


@torch.no_grad()
def collect_hf_state_dict(model: nn.Module, layout: str | None = None,
                          dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """The full HF-named state dict assembled from all TP ranks (collective over TP); the tensors on
    the writing rank, an empty dict elsewhere."""
    module = unwrap_model(model)
    config = module.config
    layout = layout or default_layout(config)
    check_exportable(config, layout)
    if parallel_state.model_parallel_is_initialized() and parallel_state.get_pipeline_model_parallel_size() > 1:
        raise NotImplementedError("save_hf_checkpoint with pipeline parallelism: gather the stages first")
    tp, _ = _tp()
    writer = writes_files()
    shapes = hf_shapes(config, layout)
    out: dict[str, torch.Tensor] = {}
    for raw_name, param in module.named_parameters():
        name = clean_name(raw_name)
        shards = gather_shards(param, tp)
        if not writer:
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
    if writer and set(out) != set(shapes):
        raise RuntimeError(f"export is missing HF tensors {sorted(set(shapes) - set(out))}")
    return out


def save_hf_checkpoint(model: nn.Module, out_dir: str | os.PathLike, layout: str | None = None,
                       dtype: torch.dtype | None = None) -> None:
    """Write ``config.json`` + ``model.safetensors`` that ``GPT2LMHeadModel`` (``layout="gpt2"``) or
    ``GPTNeoXForCausalLM`` (``"gpt_neox"``) ``.from_pretrained`` loads. Collective over TP; one rank
    writes. The Megatron vocabulary padding is dropped."""
    module = unwrap_model(model)
    layout = layout or default_layout(module.config)
    tensors = collect_hf_state_dict(module, layout, dtype)
    if tensors:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        hf_config = to_hf_config(module.config, layout)
        if dtype is not None:
            hf_config["torch_dtype"] = str(dtype).replace("torch.", "")
        (out / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
        save_file({k: v.contiguous() for k, v in sorted(tensors.items())}, str(out / "model.safetensors"),
                  metadata={"format": "pt"})
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
