"""Saving over an existing tag never loses the checkpoint already there: the new save is written
to a temporary sibling, committed, then swapped in; crashes at any point are recovered."""

from __future__ import annotations

import os
import shutil

import pytest
import torch
from ckpt_helpers import FailingStorage, TinyNet, register_storage

import nxd
from nxd_ckpt import CheckpointError


class FailsAtOptimizer(FailingStorage):
    """Fails once the model shard is written: a save that dies half-way."""

    fail_on = "optim/"

    def __init__(self, root: str, options: dict | None = None) -> None:
        super().__init__("failing://" + root[len("failsatoptim://"):], options)


def _model(seed: int) -> TinyNet:
    torch.manual_seed(seed)
    return TinyNet()


def _loads_as(path: str, seed: int, content: object, tag: str | None = "a") -> None:
    model = TinyNet()
    assert nxd.load_checkpoint(path, tag, model=model, load_rng=False) == content
    expected = _model(seed)
    for k, v in expected.state_dict().items():
        assert torch.equal(model.state_dict()[k], v), k


def test_failed_save_over_existing_tag_keeps_it(tmp_path):
    register_storage("failsatoptim", FailsAtOptimizer)
    old = _model(1)
    nxd.save_checkpoint(str(tmp_path), "a", model=old, user_content="old")
    new = _model(2)
    opt = torch.optim.SGD(new.parameters(), lr=0.1)
    for async_save in (False, True):
        with pytest.raises(CheckpointError, match="No space left on device"):
            nxd.save_checkpoint(f"failsatoptim://{tmp_path}", "a", model=new, optimizer=opt, user_content="new",
                                async_save=async_save)
            nxd.finalize_checkpoint()
        # the half-written new version sits in the temporary; the old one is intact
        assert (tmp_path / ".saving-a" / "model" / "dp_rank_00_tp_rank_00_pp_rank_00.pt").is_file()
        assert (tmp_path / "a" / "done").is_file() and nxd.has_checkpoint(str(tmp_path))
        _loads_as(str(tmp_path), 1, "old")
    _loads_as(str(tmp_path), 1, "old", tag=None)  # auto-resume removes the temporary
    assert sorted(os.listdir(tmp_path)) == ["a", "newest"]


@pytest.mark.parametrize("root", ["local", "memory"])
def test_successful_overwrite_replaces_the_tag(tmp_path, root):
    # memory:// has no directory rename: the swap copies file by file ('done' last)
    path = str(tmp_path) if root == "local" else f"memory://{tmp_path.name}"
    nxd.save_checkpoint(path, "a", model=_model(1), user_content="old")
    nxd.save_checkpoint(path, "b", model=_model(3), user_content="b")
    nxd.save_checkpoint(path, "a", model=_model(2), user_content="new", async_save=True)
    nxd.finalize_checkpoint()
    _loads_as(path, 2, "new")
    _loads_as(path, 2, "new", tag=None)  # the overwrite is the newest checkpoint
    from nxd_ckpt.storage import open_storage

    assert open_storage(path).list_dirs("") == ["a", "b"]


def _committed_temp(tmp_path, seed: int) -> None:
    """A complete new version of 'a' left in its temporary by a crash before the swap."""
    scratch = tmp_path.parent / f"{tmp_path.name}_scratch"
    nxd.save_checkpoint(str(scratch), "a", model=_model(seed), user_content="new")
    shutil.move(scratch / "a", tmp_path / ".saving-a")


@pytest.mark.parametrize("crash", ["before_delete", "half_deleted", "deleted"])
def test_crash_during_swap_is_recovered(tmp_path, crash):
    nxd.save_checkpoint(str(tmp_path), "a", model=_model(1), user_content="old")
    _committed_temp(tmp_path, 2)
    if crash == "half_deleted":  # deletion removes 'done' first, then stops
        os.remove(tmp_path / "a" / "done")
        os.remove(tmp_path / "a" / "metadata.json")
    elif crash == "deleted":
        shutil.rmtree(tmp_path / "a")
    assert nxd.has_checkpoint(str(tmp_path))
    _loads_as(str(tmp_path), 2, "new")  # an explicit tag reads the committed temporary
    assert (tmp_path / ".saving-a").is_dir()  # ... without changing anything
    _loads_as(str(tmp_path), 2, "new", tag=None)  # auto-resume finishes the swap
    assert sorted(os.listdir(tmp_path)) == ["a", "newest"]
    _loads_as(str(tmp_path), 2, "new")


def test_next_save_finishes_a_crashed_swap(tmp_path):
    nxd.save_checkpoint(str(tmp_path), "a", model=_model(1), user_content="old")
    _committed_temp(tmp_path, 2)
    shutil.rmtree(tmp_path / "a")
    nxd.save_checkpoint(str(tmp_path), "b", model=_model(3), user_content="b", num_kept_ckpts=2)
    assert sorted(os.listdir(tmp_path)) == ["a", "b", "newest"]
    _loads_as(str(tmp_path), 2, "new")


def two_rank_body(path: str) -> list[str]:
    import time

    import torch.distributed as dist

    rank = dist.get_rank()
    if rank == 1:
        time.sleep(1.1)  # rank 1's timestamp tag differs from rank 0's: rank 0's must win
    nxd.save_checkpoint(path, "", model=_model(1), user_content="first", async_save=True)
    nxd.finalize_checkpoint()
    (tag,) = [n for n in os.listdir(path) if n.startswith("ckpt_")]
    # both ranks write their files into the temporary (synchronous this time), rank 0 swaps it in
    nxd.save_checkpoint(path, tag, model=_model(2), optimizer=torch.optim.SGD(_model(2).parameters(), lr=0.1),
                        user_content="second")
    nxd.finalize_checkpoint()
    _loads_as(path, 2, "second", tag=None)
    return sorted(os.listdir(os.path.join(path, tag, "rng")))


def test_two_ranks_agree_on_the_tag_and_overwrite(rank_pool, tmp_path):
    assert rank_pool(2).run(two_rank_body, str(tmp_path)) == [["rank_00000.pt", "rank_00001.pt"]] * 2
    assert sorted(os.listdir(tmp_path)) == [*[n for n in os.listdir(tmp_path) if n.startswith("ckpt_")], "newest"]
