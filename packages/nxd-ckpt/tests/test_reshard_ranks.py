"""Resharding on load across TP and PP sizes, on real gloo ranks.

Oracle: core-parallel layers built with the same seed hold the same full weights at any TP size
(see tp_models.py), so a load into (tp, pp) must reproduce, bit for bit, the state of a model
built directly at (tp, pp) with the saving seed.
"""

from __future__ import annotations

import pytest
import torch
from tp_models import build

import nxd
from nxd_ckpt import CheckpointError

SAVE_SEED, OTHER_SEED = 1234, 99


def save_body(path: str, tp: int, pp: int, tag: str, fmt: str = "torch", fuse_qkv: bool = True) -> int:
    model = build(tp, pp, SAVE_SEED, fuse_qkv=fuse_qkv)
    nxd.save_checkpoint(path, tag, model=model, user_content={"saved_at": (tp, pp)}, format=fmt)
    return len(model.state_dict())


def load_body(path: str, tp: int, pp: int, tag: str, fuse_qkv: bool = True) -> dict:
    model = build(tp, pp, OTHER_SEED, fuse_qkv=fuse_qkv)
    content = nxd.load_checkpoint(path, tag, model=model)
    reference = build(tp, pp, SAVE_SEED, fuse_qkv=fuse_qkv).state_dict()
    loaded = model.state_dict()
    assert loaded.keys() == reference.keys()
    differ = [k for k in reference if not torch.equal(loaded[k], reference[k])]
    other = build(tp, pp, OTHER_SEED, fuse_qkv=fuse_qkv).state_dict()
    changed = sum(not torch.equal(v, other[k]) for k, v in loaded.items())
    return {"differ": differ, "changed": changed, "content": content}


@pytest.mark.parametrize(("src", "dst"), [((2, 1), (1, 1)), ((1, 1), (2, 1)), ((2, 1), (1, 2)), ((1, 2), (2, 1))])
def test_model_reshards_across_tp_and_pp(rank_pool, tmp_path, src, dst):
    pool = rank_pool(2)
    pool.run(save_body, str(tmp_path), *src, "t")
    for result in pool.run(load_body, str(tmp_path), *dst, "t"):
        assert result["differ"] == []
        assert result["changed"] > 0  # the load really replaced the other seed's weights
        assert result["content"] == {"saved_at": src}


def test_unfused_qkv_and_safetensors_reshard(rank_pool, tmp_path):
    pool = rank_pool(2)
    pool.run(save_body, str(tmp_path), 2, 1, "s", "safetensors", False)
    for result in pool.run(load_body, str(tmp_path), 1, 1, "s", False):
        assert result["differ"] == []


def same_layout_body(path: str) -> list[str]:
    model = build(2, 1, SAVE_SEED)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    nxd.save_checkpoint(path, "same", model=model, optimizer=opt)
    model2 = build(2, 1, OTHER_SEED)
    opt2 = torch.optim.SGD(model2.parameters(), lr=0.1, momentum=0.9)
    nxd.load_checkpoint(path, "same", model=model2, optimizer=opt2)
    bad = [k for k, v in model.state_dict().items() if not torch.equal(v, model2.state_dict()[k])]
    for i, st in opt.state_dict()["state"].items():
        if not torch.equal(st["momentum_buffer"], opt2.state_dict()["state"][i]["momentum_buffer"]):
            bad.append(f"momentum {i}")
    return bad


def test_same_layout_model_and_optimizer_round_trip(rank_pool, tmp_path):
    assert rank_pool(2).run(same_layout_body, str(tmp_path)) == [[], []]


def optimizer_across_tp_body(path: str) -> str:
    model = build(1, 1, OTHER_SEED)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    try:
        nxd.load_checkpoint(path, "same", model=model, optimizer=opt)
    except CheckpointError as exc:
        return str(exc)
    return "no error"


def test_optimizer_state_does_not_silently_reshard_across_tp(rank_pool, tmp_path):
    pool = rank_pool(2)
    pool.run(same_layout_body, str(tmp_path))
    for message in pool.run(optimizer_across_tp_body, str(tmp_path)):
        assert "TP=2" in message and "optimizer=None" in message


def shape_mismatch_body(path: str) -> str:
    from tp_models import ShardedNet

    from nxd_core_parallel import parallel_state

    parallel_state.initialize_model_parallel(1, 1)
    model = ShardedNet(layers=2)
    model.head = torch.nn.Linear(8, 32, bias=False)  # wrong vocabulary size
    try:
        nxd.load_checkpoint(path, "t", model=model)
    except CheckpointError as exc:
        return str(exc)
    return "no error"


def test_shape_mismatch_names_the_tensor(rank_pool, tmp_path):
    pool = rank_pool(2)
    pool.run(save_body, str(tmp_path), 2, 1, "t")
    for message in pool.run(shape_mismatch_body, str(tmp_path)):
        assert "'head.weight'" in message and "[16, 8]" in message and "[32, 8]" in message
