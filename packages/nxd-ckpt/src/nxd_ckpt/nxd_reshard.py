"""NxD-written tags loaded at another TP/PP, and NxD's K/V-replica layouts put into nxd's.

NxD's files record no sharding, but the model being loaded does (its parameters' attributes):
a tensor's sharding at the TP the tag was written at follows from the model's at this run's TP
and the saved shard's size. The only thing a size does not tell is where NxD put the replicas of
K/V heads repeated over TP (``kv_size_multiplier`` m): NxD trained on trn2 keeps them adjacent
(``repeat_interleave``: rank r holds piece r // m, nxd's layout), on trn1 and in every file of
its ``checkpoint_converter`` tiled (``repeat``: rank r holds piece r % (tp / m)). NxD's
attention pairs each rank's query heads with that rank's K/V piece, so the files are read by
that rule: the replica layout is recognised from the saved K/V themselves, and the ranks of a
tiled layout are renumbered into the adjacent one, each rank's query heads and ``o_proj``
columns moving with its K/V piece. The model that results computes what NxD's modules compute
with the files, in nxd's layout (so a later export or reshard keeps the heads in order).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from nxd_ckpt.errors import CheckpointError
from nxd_ckpt.layout import parse_shard_name, shard_ep_rank
from nxd_ckpt.nxd_layouts import adapt_qkv_names, attention_prefix, nxd_written_degrees, qkv_layers
from nxd_ckpt.sharding import Sharding, global_shape, merge_shards, split_full


def _whole(numerator: int, denominator: int) -> int | None:
    return numerator // denominator if denominator and numerator % denominator == 0 else None


def saved_sharding(target: Sharding, target_local: int, tp: int, saved_local: int, saved_tp: int, name: str,
                   kv: bool) -> Sharding:
    """``target`` (this model's sharding at ``tp``) as it was at ``saved_tp``, from the saved
    shard's size along the sharded dim. The K/V pieces (``kv``: a GQA projection's K, V or fused
    QKV tensor) take the multiplier their size implies; any other size that is no ``saved_tp``
    share of the model's tensor is refused."""
    if target.size is not None:  # pad=True: merging concatenates and drops the padding at any TP
        return target
    fused = target.fused_splits is not None
    full = [p * tp // m for p, m in zip(target.fused_splits or (target_local,), target.piece_multipliers())]
    if fused:  # the first piece (Q, or gate) is never replicated; the rest share one multiplier
        first = _whole(full[0], saved_tp)
        rest = _whole(saved_local - (first or 0), len(full) - 1) if first is not None else None
        pieces = [first, *[rest] * (len(full) - 1)] if rest is not None else []
    else:
        pieces = [saved_local]
    mults = [_whole(p * saved_tp, g) for p, g in zip(pieces, full)]
    ok = bool(pieces) and all(m is not None and m >= 1 and saved_tp % m == 0 for m in mults) and \
        (mults[0] == 1 if fused else True) and len(set(mults[1:] if fused else mults)) <= 1 and \
        (kv or set(mults) == {1})
    if not ok:
        raise CheckpointError(f"tensor {name!r}: NxD's shards of it at TP={saved_tp} hold {saved_local} rows along dim "
                              f"{target.dim}, which is no TP={saved_tp} share of the model's {sum(full)}: was the "
                              "checkpoint saved from a different model config?")
    return Sharding(target.dim, target.stride, tuple(pieces) if fused else None, mults[-1])


def kv_rank_order(kv_shards: list[torch.Tensor], mult: int, where: str) -> tuple[list[int], str]:
    """``(order, layout)``: ``order[r]`` is the saved TP rank whose attention shards nxd's rank
    ``r`` takes, so that the replicas of each K/V piece sit on adjacent ranks, and the layout the
    saved copies were found in ("adjacent" or "tiled"). ``kv_shards`` are each saved rank's K/V."""
    tp = len(kv_shards)
    parts = tp // mult
    same = [[torch.equal(kv_shards[r], kv_shards[o]) for o in range(tp)] for r in range(tp)]
    if all(same[r][(r // mult) * mult] for r in range(tp)):
        return list(range(tp)), "adjacent"
    if all(same[r][r % parts] for r in range(tp)):
        return [(r % mult) * parts + r // mult for r in range(tp)], "tiled"
    raise CheckpointError(f"{where}: its K/V heads are replicated {mult} times over TP={tp}, but the copies sit "
                          "neither on adjacent ranks (NxD on trn2) nor tiled over the ranks (NxD on trn1, NxD's "
                          "checkpoint_converter): not a layout NxD writes, so which query heads attend which K/V "
                          "piece is unknown")


def kv_tensor_names(module: torch.nn.Module) -> set[str]:
    """The names of ``module``'s GQA K/V (or fused QKV) weights and biases, whose NxD shards may hold
    K/V heads replicated over TP."""
    return {f"{prefix}{kind}_{p}" for prefix, _ in qkv_layers(module) for kind in ("weight", "bias")
            for p in ("qkv", "k", "v")}


def needs_nxd_reshard(reader: Any, shardings: dict[str, Sharding | None], tp: int, pp: int) -> bool:
    """Whether an NxD-written tag needs more than this rank's own file: it was written at another
    TP/PP, or its K/V heads are replicated over TP with more than one distinct piece (their replica
    layout is read from every rank's copy)."""
    if nxd_written_degrees(reader.storage, reader.tag) != (tp, pp):
        return True
    return any(sh is not None and 1 < sh.kv_size_multiplier < tp for sh in shardings.values())


def nxd_written_state(reader: Any, module: torch.nn.Module, shardings: dict[str, Sharding | None], tp: int,
                      tp_rank: int, pp: int) -> tuple[dict[str, torch.Tensor], list[str]]:
    """This rank's model state (the model's names, this run's TP/PP) from every shard of an
    NxD-written tag, and the attention modules whose ranks were renumbered from NxD's tiled
    K/V layout. Tensors of the files that match no model name are returned too (at PP=1) so
    a strict load names them."""
    from nxd_ckpt.load import model_file

    storage, tag = reader.storage, reader.tag
    where = storage.describe(tag)
    saved_tp, saved_pp = nxd_written_degrees(storage, tag)
    files = [n for n in storage.list_files(f"{tag}/model") if parse_shard_name(n)]
    if any(shard_ep_rank(n) is not None for n in files):
        raise CheckpointError(f"{where}: NxD wrote its model files per expert-parallel rank; nxd reads them at the "
                              f"TP/PP they were written at (TP={saved_tp} PP={saved_pp}) only: load it there and save "
                              "it with nxd.save_checkpoint (which reshards on load), or merge it with NxD's "
                              "checkpoint_converter --convert_to_full_state first")
    ranks = [[adapt_qkv_names(reader.load(*model_file(None, reader, r, p)), module, saved_tp) for r in range(saved_tp)]
             for p in range(saved_pp)]
    stage = {name: p for p in reversed(range(saved_pp)) for name in ranks[p][0]}
    target = module.state_dict()
    order: dict[str, list[int]] = {}
    tiled: list[str] = []
    kv_names = kv_tensor_names(module)
    for prefix, layer in qkv_layers(module):
        fused, k = f"{prefix}weight_qkv", f"{prefix}weight_k"
        name = fused if fused in stage else k
        if name not in stage:
            continue
        shards = [ranks[stage[name]][r][name] for r in range(saved_tp)]
        if name == fused:
            shards = [s[layer.q_size // saved_tp:] for s in shards]
        mult = shards[0].shape[0] * saved_tp // (layer.kv_size * (2 if name == fused else 1))
        if 1 < mult < saved_tp:
            order[attention_prefix(prefix)], layout = kv_rank_order(shards, mult, f"{where}: {prefix[:-1]}")
            if layout == "tiled":
                tiled.append(attention_prefix(prefix)[:-1])
    out: dict[str, torch.Tensor] = {}
    for name, want in target.items():
        if name not in stage:
            continue
        shards = [ranks[stage[name]][r][name] for r in range(saved_tp)]
        sh = shardings.get(name)
        if sh is None:  # replicated over TP in the model: NxD's copy on TP rank 0
            if list(shards[0].shape) != list(want.shape):
                raise CheckpointError(f"tensor {name!r}: NxD's TP rank 0 file in {where} holds it as "
                                      f"{list(shards[0].shape)}, the model's (not TP-sharded) is {list(want.shape)}")
            out[name] = shards[0]
            continue
        attention = next((a for a in order if name.startswith(a)), None)
        if attention is not None:
            shards = [shards[o] for o in order[attention]]
        saved = saved_sharding(sh, want.shape[sh.dim], tp, shards[0].shape[sh.dim], saved_tp, name, name in kv_names)
        full = merge_shards(shards, saved)
        expected = global_shape(tuple(want.shape), sh, tp)
        if list(full.shape) != expected:
            raise CheckpointError(f"tensor {name!r}: NxD's TP={saved_tp} shards of it in {where} assemble to "
                                  f"{list(full.shape)}, the model's is {expected} (saved from a different model config?)")
        out[name] = split_full(full, sh, tp, tp_rank, name)
    if pp == 1:
        for name, p in stage.items():
            out.setdefault(name, ranks[p][0][name])
    return out, tiled


def warn_tiled(where: str, tiled: list[str], tp: int) -> None:
    """NxD's tiled K/V layout is read as NxD's attention computes it. One file of that layout is
    not what its writer meant: NxD's checkpoint_converter --hw_backend trn2 keeps the query heads
    in order beside tiled K/V, so NxD's own modules pair them differently from the source model."""
    warnings.warn(
        f"{where}: {len(tiled)} attention module(s) ({tiled[0]}{', ...' if len(tiled) > 1 else ''}) hold K/V heads "
        f"tiled over TP={tp} (NxD's trn1 layout and its checkpoint_converter's): loaded as NxD's attention computes "
        "them (each rank's query heads with its K/V piece), renumbered into nxd's adjacent layout. A file NxD's "
        "checkpoint_converter wrote with --hw_backend trn2 and more than one distinct K/V piece does not compute its "
        "source model in NxD either (the converter leaves the query heads in order beside tiled K/V): convert it with "
        "--hw_backend trn1 instead (the same weights, in NxD's consistent layout)", stacklevel=5)
