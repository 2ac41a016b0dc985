"""Checkpoints NxD wrote, read as written.

NxD's ``save_checkpoint`` and its ``scripts/checkpoint_converter.py`` write
``<tag>/model/dp_rank_00[_ep_rank_EE]_tp_rank_TT_pp_rank_PP.pt`` (torch, or torch-xla's xser
reference file plus ``.pt.tensors/``) with no metadata.json; the converter writes no ``done``
marker either. Such a tag is recognised by that layout when it is named explicitly.

NxD's modules name the attention projection three ways, all of which NxD's converter writes
(``--qkv_linear``/``--fuse_qkv``): ``qkv_proj.weight_qkv`` (fused ``GQAQKVColumnParallelLinear``),
``qkv_proj.weight_q/_k/_v`` (``fuse_qkv=False``) and plain ``q_proj/k_proj/v_proj.weight``
(``ColumnParallelLinear``). :func:`adapt_qkv_names` turns a rank's state into the naming of the
model being loaded (same TP: every piece is this rank's local rows, fused rows are
``[q | k | v]``), so no parameter is left at its initial value by a naming difference.
"""

from __future__ import annotations

from typing import Any

import torch

from nxd_ckpt.layout import DONE_MARKER, METADATA, parse_shard_name
from nxd_ckpt.storage import Storage


def is_nxd_written(storage: Storage, tag: str) -> bool:
    """``tag`` holds a checkpoint in NxD's own layout: model shard files, and none of the files
    nxd-ckpt writes (metadata.json, rng/, done). Without ``done`` nothing says it is complete, so
    only an explicitly named tag is loaded this way."""
    if storage.exists(f"{tag}/{METADATA}") or storage.exists(f"{tag}/{DONE_MARKER}"):
        return False
    if storage.list_files(f"{tag}/rng"):
        return False
    return any(parse_shard_name(n) for n in storage.list_files(f"{tag}/model"))


def nxd_written_degrees(storage: Storage, tag: str) -> tuple[int, int]:
    """``(tp, pp)`` an NxD-written tag was saved at: the TP and PP ranks its model files name."""
    parsed = [p for p in (parse_shard_name(n) for n in storage.list_files(f"{tag}/model")) if p]
    return 1 + max((p[1] for p in parsed), default=0), 1 + max((p[2] for p in parsed), default=0)


def qkv_layers(module: torch.nn.Module) -> list[tuple[str, Any]]:
    """``(prefix, layer)`` of every GQA QKV projection of ``module`` (prefix ends with '.')."""
    from nxd_tensor_parallel.modules.qkv_linear import GQAQKVColumnParallelLinear

    return [(f"{name}." if name else "", m) for name, m in module.named_modules()
            if isinstance(m, GQAQKVColumnParallelLinear)]


def attention_prefix(qkv_prefix: str) -> str:
    """The prefix of the attention module holding the QKV projection at ``qkv_prefix``."""
    return qkv_prefix.rsplit(".", 2)[0] + "." if qkv_prefix.count(".") > 1 else ""


def adapt_qkv_names(state: dict[str, Any], module: torch.nn.Module, saved_tp: int | None = None) -> dict[str, Any]:
    """``state`` (one rank's tensors, written at TP ``saved_tp``, default the model's) with its
    Q/K/V projections renamed, fused or split into the naming ``module``'s GQA projections use.
    Entries already named as the model wants, and everything else, pass unchanged."""
    out = dict(state)
    for prefix, layer in qkv_layers(module):
        parent = attention_prefix(prefix)
        q_rows = layer.q_local if saved_tp is None else layer.q_size // saved_tp
        for kind in ("weight", "bias"):
            fused = f"{prefix}{kind}_qkv"
            split = [f"{prefix}{kind}_{p}" for p in "qkv"]
            plain = [f"{parent}{p}_proj.{kind}" for p in "qkv"]
            if layer.fuse_qkv:
                if fused in out:
                    continue
                for names in (split, plain):
                    if all(n in out for n in names):
                        out[fused] = torch.cat([out.pop(n) for n in names], dim=0)
                        break
            else:
                if all(n in out for n in split):
                    continue
                kv_rows = (out[fused].shape[0] - q_rows) // 2 if fused in out else 0
                if fused in out and (saved_tp is not None or kv_rows == layer.kv_local) and kv_rows > 0:
                    for n, piece in zip(split, out.pop(fused).split((q_rows, kv_rows, kv_rows), dim=0)):
                        out[n] = piece.clone()
                elif all(n in out for n in plain):
                    for n, p in zip(split, plain):
                        out[n] = out.pop(p)
    return out
