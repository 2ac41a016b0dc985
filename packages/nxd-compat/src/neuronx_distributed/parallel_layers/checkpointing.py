"""``neuronx_distributed.parallel_layers.checkpointing``: NxD's per-rank ``save`` / ``load``.

NxD's layout, names and arguments (its ``parallel_layers/checkpointing.py``, Release 2.29):

    save_dir/tp_rank_TT_pp_rank_PP/checkpoint.pt          torch.save of the rank's dict
    save_dir/tp_rank_TT_pp_rank_PP_dp_rank_DD/...         with master_dp_only=False
    save_dir/tp_rank_TT_pp_rank_PP (+ .tensors/)          with save_xser (torch-xla's xser layout)

Only DP rank 0 writes (``master_dp_only``). ``load`` returns the rest of the dict after the
``model_key`` entry went into ``model_or_optimizer``; ``sharded=False`` reads one full state dict
(a file) and cuts this rank's shards with the parameters' TP attributes. Differences from NxD:
a partial load (``strict=False``) warns naming every parameter left at its initial value, and the
full state dict is cut with nxd-ckpt's resharder (fused QKV, KV replicas, padding understood).
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import torch
import torch.distributed as dist

from neuronx_distributed.parallel_layers.parallel_state import (
    get_data_parallel_rank,
    get_pipeline_model_parallel_rank,
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_size,
)
from nxd_compat import xser

NXD_SKIP_RENDEZVOUS = "NXD_SKIP_RENDEZVOUS"
CHECKPOINT_FILE = "checkpoint.pt"

__all__ = ["ensure_directory_exists", "get_sharded_model_dict", "has_checkpoint", "load", "save"]


def ensure_directory_exists(filename: str) -> None:
    os.makedirs(os.path.dirname(filename), exist_ok=True)


def rank_path(save_dir: str, xser_layout: bool, master_dp_only: bool = True) -> str:
    """This rank's file in NxD's layout."""
    path = os.path.join(save_dir, f"tp_rank_{get_tensor_model_parallel_rank():02d}_pp_rank_"
                                  f"{get_pipeline_model_parallel_rank():02d}")
    if not master_dp_only:
        path += f"_dp_rank_{get_data_parallel_rank():02d}"
    return path if xser_layout else os.path.join(path, CHECKPOINT_FILE)


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized() and os.environ.get(NXD_SKIP_RENDEZVOUS) != "1":
        dist.barrier()


def _cast(state: Any, from_dtype: torch.dtype, to_dtype: torch.dtype) -> Any:
    if isinstance(state, torch.Tensor):
        return state.to(to_dtype) if state.dtype == from_dtype else state
    if isinstance(state, dict):
        return {k: _cast(v, from_dtype, to_dtype) for k, v in state.items()}
    if isinstance(state, (list, tuple)) and not hasattr(state, "_fields"):
        return type(state)(_cast(v, from_dtype, to_dtype) for v in state)
    return state


def _to_cpu(state: Any) -> Any:
    if isinstance(state, torch.Tensor):
        return state.detach().cpu()
    if isinstance(state, dict):
        return {k: _to_cpu(v) for k, v in state.items()}
    if isinstance(state, (list, tuple)) and not hasattr(state, "_fields"):
        return type(state)(_to_cpu(v) for v in state)
    return state


def save(checkpoint: dict, output_dir: str, save_serially: bool = True, save_xser: bool = False,
         down_cast_bf16: bool = False, master_dp_only: bool = True) -> None:
    """Write this rank's ``checkpoint`` in NxD's layout (see the module docstring). Every rank
    must call it; ``save_serially`` is accepted (each rank writes its own file)."""
    path = rank_path(output_dir, save_xser, master_dp_only)
    if down_cast_bf16:
        checkpoint = _cast(checkpoint, torch.float32, torch.bfloat16)
    writes = get_data_parallel_rank() == 0 or not master_dp_only
    if writes:
        ensure_directory_exists(path)
        if save_xser:
            xser.save(checkpoint, path, master_only=False)
        else:
            tmp = f"{path}.tmp{os.getpid()}"
            torch.save(_to_cpu(checkpoint), tmp)
            os.replace(tmp, path)  # a reader never sees a half-written file
    _barrier()


def get_sharded_model_dict(model: torch.nn.Module, model_state_dict: dict[str, Any]) -> dict[str, Any]:
    """Cut a full (TP=1) state dict into this rank's shards, by the parameters' TP attributes."""
    from nxd_ckpt.metadata import shardings_of
    from nxd_ckpt.sharding import split_full
    from nxd_ckpt.snapshot import unwrap_model

    module = unwrap_model(model)
    tp, rank = get_tensor_model_parallel_size(), get_tensor_model_parallel_rank()
    out = dict(model_state_dict)
    for name, sharding in shardings_of(module).items():
        if sharding is not None and name in out:
            out[name] = split_full(out[name], sharding, tp, rank, name)
    return out


def _xser_load(path: str, weights_only: bool = False) -> Any:
    """NxD's: the reference file read with ``torch.load`` (as saved), then each tensor's own file."""
    with xser.reading_references():
        ref_data = torch.load(path, weights_only=weights_only)
    return xser.resolve_references(ref_data, path)


def _read(path: str, load_xser: bool, weights_only: bool) -> Any:
    # NxD's calls (its unit tests assert them); a missing file is reported with the layout it expected
    try:
        if load_xser or xser.is_xser(path):
            return _xser_load(path, weights_only=weights_only)
        return torch.load(path, weights_only=weights_only, map_location="cpu")
    except FileNotFoundError as err:
        layout = "xser reference file" if load_xser else "file"
        raise FileNotFoundError(f"{path}: no such checkpoint {layout} for tp_rank {get_tensor_model_parallel_rank()} "
                                f"pp_rank {get_pipeline_model_parallel_rank()} (saved with this TP/PP size and "
                                f"save_xser={load_xser}?)") from err


def load_into_module(module: torch.nn.Module, state: dict[str, Any], strict: bool, where: str) -> None:
    """``load_state_dict`` that never leaves a parameter at its initial value unnamed."""
    from nxd_ckpt.snapshot import unwrap_model

    target = unwrap_model(module)
    result = target.load_state_dict(state, strict=strict)
    if result.missing_keys:
        warnings.warn(f"{where}: strict=False left {len(result.missing_keys)} parameter(s)/buffer(s) of the model at "
                      f"their initial values (not in the checkpoint): {result.missing_keys}", stacklevel=3)
    if result.unexpected_keys:
        warnings.warn(f"{where}: {len(result.unexpected_keys)} checkpoint entries match nothing in the model and "
                      f"were ignored: {result.unexpected_keys}", stacklevel=3)


def load(chkpt_path: str, model: torch.nn.Module | None = None, model_or_optimizer: Any = None,
         model_key: str | None = "model", load_xser: bool = False, sharded: bool = True, strict: bool = True,
         master_dp_only: bool = True, weights_only: bool = False) -> Any:
    """Load this rank's checkpoint (NxD's arguments). With ``model_or_optimizer`` the entry
    ``model_key`` (the whole dict when ``model_key`` is None) is loaded into it and the rest of
    the dict is returned. ``weights_only=False`` is NxD's default: only load files you trust."""
    if model is not None:
        model_or_optimizer = model  # NxD's older keyword (and second positional argument)
    if not sharded and model_or_optimizer is None:
        raise ValueError("load(sharded=False) reads a full state dict and needs model_or_optimizer to cut it")
    path = rank_path(chkpt_path, load_xser, master_dp_only) if sharded else chkpt_path
    checkpoint = _read(path, load_xser, weights_only)
    if model_or_optimizer is not None:
        if model_key is not None and model_key not in checkpoint:
            raise KeyError(f"{path}: no entry {model_key!r} (entries: {sorted(checkpoint)[:10]}); pass the "
                           "model_key the checkpoint was saved with, or model_key=None for a bare state dict")
        state = checkpoint[model_key] if model_key is not None else checkpoint
        if isinstance(model_or_optimizer, torch.optim.Optimizer):
            model_or_optimizer.load_state_dict(state)
        else:
            if not sharded:
                state = get_sharded_model_dict(model_or_optimizer, state)
            load_into_module(model_or_optimizer, state, strict, path)
        if model_key is not None:
            del checkpoint[model_key]
        else:
            checkpoint = None
    _barrier()
    return checkpoint


def has_checkpoint(path: str) -> bool:
    from nxd import has_checkpoint as nxd_has_checkpoint

    return nxd_has_checkpoint(path)
