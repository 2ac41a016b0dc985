"""Resharding GQA K/V replicated over TP (``kv_size_multiplier``) in nxd-core-parallel's Megatron
layout: TP rank r holds KV piece r // m, replicas on neighbouring ranks.

Oracle as in test_reshard_ranks.py: a model built with the saving seed directly at the target TP
size. At TP=4 with 2 KV pieces (m=2) the tiled and adjacent layouts differ, so a resharder that
assumed the wrong one would load the wrong piece on ranks 1 and 2.
"""

from __future__ import annotations

import pytest
import torch
from tp_models import build

import nxd
from nxd_ckpt import Sharding, merge_shards, split_full

SAVE_SEED, OTHER_SEED = 4321, 7


def save_body(path: str, tp: int, tag: str, kv_pieces: int, fuse_qkv: bool) -> None:
    model = build(tp, 1, SAVE_SEED, fuse_qkv=fuse_qkv, kv_pieces=kv_pieces)
    nxd.save_checkpoint(path, tag, model=model)


def load_body(path: str, tp: int, tag: str, kv_pieces: int, fuse_qkv: bool) -> list[str]:
    # world 4: TP=2/1 loads run with DP=2/4, every replica loads
    model = build(tp, 1, OTHER_SEED, fuse_qkv=fuse_qkv, kv_pieces=kv_pieces)
    nxd.load_checkpoint(path, tag, model=model)
    reference = build(tp, 1, SAVE_SEED, fuse_qkv=fuse_qkv, kv_pieces=kv_pieces).state_dict()
    loaded = model.state_dict()
    return [k for k in reference if not torch.equal(loaded[k], reference[k])]


def kv_shard_body(kv_pieces: int) -> torch.Tensor:
    model = build(4, 1, SAVE_SEED, kv_pieces=kv_pieces)
    return model.layers["0"].qkv.weight_qkv.detach().clone()


@pytest.mark.slow
@pytest.mark.parametrize("fuse_qkv", [True, False])
def test_replicated_kv_reshards_between_tp4_and_tp1_tp2(rank_pool, tmp_path, fuse_qkv):
    pool = rank_pool(4)
    pool.run(save_body, str(tmp_path), 4, "tp4", 2, fuse_qkv)
    for tp in (2, 1):
        assert pool.run(load_body, str(tmp_path), tp, "tp4", 2, fuse_qkv) == [[]] * 4, tp
    pool.run(save_body, str(tmp_path), 1, "tp1", 2, fuse_qkv)
    assert pool.run(load_body, str(tmp_path), 4, "tp1", 2, fuse_qkv) == [[]] * 4
    if fuse_qkv:  # the layout really is adjacent: ranks 0,1 share a piece, 2,3 the other
        shards = pool.run(kv_shard_body, 2)
        kv = [s[-2:] for s in shards]  # local rows [q (2) | k (1) | v (1)]
        assert torch.equal(kv[0], kv[1]) and torch.equal(kv[2], kv[3]) and not torch.equal(kv[0], kv[2])


def _pieces() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.arange(6.0).view(2, 3), torch.arange(6.0, 12.0).view(2, 3)


def test_merge_and_split_use_the_adjacent_layout():
    a, b = _pieces()
    sh = Sharding(dim=0, kv_size_multiplier=2)
    assert torch.equal(merge_shards([a, a, b, b], sh), torch.cat([a, b]))
    assert [torch.equal(split_full(torch.cat([a, b]), sh, 4, r), t) for r, t in enumerate((a, a, b, b))] == [True] * 4
    assert Sharding.from_json(sh.to_json()) == sh


def test_legacy_metadata_without_kv_replicas_is_read_as_tiled():
    a, b = _pieces()
    legacy = {"dim": 0, "stride": 1, "fused_splits": None, "kv_size_multiplier": 2}
    sh = Sharding.from_json(legacy)
    assert sh.kv_replicas == "tiled"
    assert torch.equal(merge_shards([a, b, a, b], sh), torch.cat([a, b]))
    with pytest.raises(ValueError, match="kv_replicas"):
        Sharding(dim=0, kv_replicas="diagonal")
