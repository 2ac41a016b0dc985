"""Single-process save/load: round trips, tag selection, retention, async snapshots, formats."""

from __future__ import annotations

import json
import os

import pytest
import torch
from ckpt_helpers import FailingStorage, TinyNet, register_storage

import nxd
from nxd_ckpt import CheckpointError


def _trained(seed: int = 0) -> tuple[TinyNet, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    torch.manual_seed(seed)
    model = TinyNet()
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    for _ in range(2):
        model(torch.randn(5, 4)).square().mean().backward()
        opt.step()
        opt.zero_grad()
        sched.step()
    return model, opt, sched


def _fresh() -> tuple[TinyNet, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    torch.manual_seed(123)
    model = TinyNet()
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    return model, opt, torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)


def _assert_same_state(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], torch.Tensor):
            assert torch.equal(a[k], b[k]), k
        elif isinstance(a[k], dict):
            _assert_same_state(a[k], b[k])
        else:
            assert a[k] == b[k], k


@pytest.mark.parametrize("fmt", ["torch", "safetensors"])
def test_round_trip_is_exact(tmp_path, fmt):
    model, opt, sched = _trained()
    nxd.save_checkpoint(str(tmp_path), "step_2", model=model, optimizer=opt, scheduler=sched,
                        user_content={"step": 2, "consumed": torch.tensor(10)}, format=fmt)
    m2, o2, s2 = _fresh()
    content = nxd.load_checkpoint(str(tmp_path), "step_2", model=m2, optimizer=o2, scheduler=s2)
    assert content["step"] == 2 and int(content["consumed"]) == 10
    _assert_same_state(model.state_dict(), m2.state_dict())
    _assert_same_state(opt.state_dict(), o2.state_dict())
    assert sched.state_dict() == s2.state_dict()
    suffix = ".safetensors" if fmt == "safetensors" else ".pt"
    assert (tmp_path / "step_2" / "model" / f"dp_rank_00_tp_rank_00_pp_rank_00{suffix}").is_file()
    assert (tmp_path / "step_2" / "optim" / "dp_rank_00_tp_rank_00_pp_rank_00.pt").is_file()
    for name in ("scheduler.pt", "user_content.pt", "done", "checkpoint", "metadata.json"):
        assert (tmp_path / "step_2" / name).is_file(), name


@pytest.mark.parametrize("fmt", ["torch", "safetensors"])
def test_large_tensors_are_hashed_while_the_file_syncs(tmp_path, fmt):
    """Tensors above the large-write threshold are hashed from their own memory after the last
    write (while the file is synced): the files are what torch / safetensors read back, and the
    recorded CRC-32 is the file's."""
    import zlib

    from safetensors.torch import load_file

    from nxd_ckpt.checksum import LARGE_WRITE

    model = torch.nn.Linear(1024, 3 * LARGE_WRITE // 4 // 1024 + 1)  # a 3 MiB+ weight
    nxd.save_checkpoint(str(tmp_path), "big", model=model, format=fmt, save_rng=False)
    suffix = ".safetensors" if fmt == "safetensors" else ".pt"
    path = tmp_path / "big" / "model" / f"dp_rank_00_tp_rank_00_pp_rank_00{suffix}"
    raw = path.read_bytes()
    recorded = json.loads((tmp_path / "big" / "metadata.json").read_text())["files"][f"model/{path.name}"]
    assert recorded == {"bytes": len(raw), "crc32": f"{zlib.crc32(raw):08x}"}
    state = load_file(path) if fmt == "safetensors" else torch.load(path, weights_only=True)
    assert torch.equal(state["weight"], model.weight.detach()) and torch.equal(state["bias"], model.bias.detach())
    m2 = torch.nn.Linear(1024, model.out_features)
    nxd.load_checkpoint(str(tmp_path), "big", model=m2)
    assert torch.equal(m2.weight, model.weight)


def test_hashing_writer_hashes_reused_buffers_before_returning(tmp_path):
    """Only memory the saver holds still is hashed late: a buffer the caller overwrites after each
    write (as torch.save may with its own scratch memory; small ones are copied, large ones hashed
    at once) and a non-contiguous tensor's temporary copy are not, so the digest is the file's."""
    import zlib

    from nxd_ckpt.checksum import LARGE_WRITE, HashingWriter, stable_regions

    held = torch.arange(LARGE_WRITE // 2, dtype=torch.int32)  # 2 MiB the saver holds
    small_held = torch.arange(256, dtype=torch.int32)  # held too: referenced, not copied
    scratch = bytearray(LARGE_WRITE)
    small_scratch = bytearray(b"x" * 64)
    path = tmp_path / "f.bin"
    with open(path, "wb") as f:
        out = HashingWriter(f, stable=stable_regions({"a": [held], "b": (small_held,)}))
        out.write(b"head")
        out.write(memoryview(held.numpy()))
        out.write(memoryview(small_held.numpy()))
        out.write(small_scratch)
        small_scratch[:] = b"y" * 64  # reused: the copy taken at write() is what was written
        for value in (1, 2):
            scratch[:] = bytes([value]) * len(scratch)
            out.write(scratch)
        out.write(memoryview(held.reshape(-1, 2).t().contiguous().numpy()))
        out.write(b"tail")
        out.hash_in_background()
        scratch[:] = bytes(len(scratch))  # reused after the writer returned
    raw = path.read_bytes()
    assert out.digest() == {"bytes": len(raw), "crc32": f"{zlib.crc32(raw):08x}"}


def test_metadata_records_degrees_shapes_and_versions(tmp_path):
    model, _, _ = _trained()
    nxd.save_checkpoint(str(tmp_path), "t", model=model)
    meta = json.loads((tmp_path / "t" / "metadata.json").read_text())
    assert meta["degrees"] == {"tp": 1, "pp": 1, "dp": 1, "ep": 1, "world": 1}
    assert meta["tensors"]["fc1.weight"] == {"shape": [8, 4], "dtype": "float32", "sharding": None, "pp_rank": 0}
    assert meta["versions"]["torch"] == torch.__version__


def test_use_xser_selects_safetensors(tmp_path):
    model, _, _ = _trained()
    nxd.save_checkpoint(str(tmp_path), "x", model=model, use_xser=True)
    assert (tmp_path / "x" / "model" / "dp_rank_00_tp_rank_00_pp_rank_00.safetensors").is_file()
    m2, _, _ = _fresh()
    nxd.load_checkpoint(str(tmp_path), "x", model=m2)
    _assert_same_state(model.state_dict(), m2.state_dict())


def test_newest_complete_tag_wins_and_partials_are_removed(tmp_path):
    model, _, _ = _trained()
    for step in (1, 2):
        nxd.save_checkpoint(str(tmp_path), f"step_{step}", model=model, user_content={"step": step})
    # an interrupted save: files but no 'done'
    partial = tmp_path / "step_3"
    (partial / "model").mkdir(parents=True)
    (partial / "checkpoint").write_text("1")
    (partial / "model" / "dp_rank_00_tp_rank_00_pp_rank_00.pt").write_bytes(b"half a file")
    assert nxd.load_checkpoint(str(tmp_path), model=TinyNet())["step"] == 2
    assert not partial.exists()
    with pytest.raises(CheckpointError, match="does not exist"):
        nxd.load_checkpoint(str(tmp_path), "step_9", model=TinyNet())


def test_explicit_incomplete_tag_is_refused(tmp_path):
    model, _, _ = _trained()
    nxd.save_checkpoint(str(tmp_path), "a", model=model)
    os.remove(tmp_path / "a" / "done")
    with pytest.raises(CheckpointError, match="incomplete"):
        nxd.load_checkpoint(str(tmp_path), "a", model=TinyNet())
    assert not nxd.has_checkpoint(str(tmp_path))
    with pytest.raises(CheckpointError, match="no complete checkpoint"):
        nxd.load_checkpoint(str(tmp_path), model=TinyNet())


def test_retention_keeps_newest(tmp_path):
    model, _, _ = _trained()
    for step in range(1, 5):
        nxd.save_checkpoint(str(tmp_path), f"step_{step}", model=model, num_kept_ckpts=2, user_content=step)
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["step_3", "step_4"]
    assert (tmp_path / "newest").read_text() == "step_4"


def test_retention_removes_done_first(tmp_path):
    """If deleting stops half-way, the old checkpoint must not look complete."""
    from nxd_ckpt.retention import delete_checkpoint
    from nxd_ckpt.storage import LocalStorage

    model, _, _ = _trained()
    nxd.save_checkpoint(str(tmp_path), "old", model=model, user_content="old")
    nxd.save_checkpoint(str(tmp_path), "new", model=model, user_content="new")

    class StopsHalfway(LocalStorage):
        def remove_tree(self, path: str) -> None:
            raise OSError("interrupted")

    with pytest.raises(OSError):
        delete_checkpoint(StopsHalfway(str(tmp_path)), "old")
    assert (tmp_path / "old" / "model").exists() and not (tmp_path / "old" / "done").exists()
    assert nxd.load_checkpoint(str(tmp_path), model=TinyNet()) == "new"


def test_async_save_writes_the_snapshot_taken_at_the_call(tmp_path):
    model, opt, _ = _trained()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    nxd.save_checkpoint(str(tmp_path), "a", model=model, optimizer=opt, async_save=True, user_content=[1])
    with torch.no_grad():  # later steps must not leak into the checkpoint
        for p in model.parameters():
            p.add_(1.0)
    nxd.finalize_checkpoint()
    m2 = TinyNet()
    assert nxd.load_checkpoint(str(tmp_path), "a", model=m2) == [1]
    _assert_same_state(before, m2.state_dict())


def test_async_failure_surfaces_at_next_call_and_keeps_last_good(tmp_path):
    register_storage("failing", FailingStorage)
    model, _, _ = _trained()
    nxd.save_checkpoint(str(tmp_path), "good", model=model, user_content="good")
    url = f"failing://{tmp_path}"
    nxd.save_checkpoint(url, "bad", model=model, async_save=True, num_kept_ckpts=1)  # returns at once
    with pytest.raises(CheckpointError, match="No space left on device"):
        nxd.finalize_checkpoint()
    nxd.finalize_checkpoint()  # reported once
    nxd.save_checkpoint(url, "bad2", model=model, async_save=True, num_kept_ckpts=1)
    with pytest.raises(CheckpointError, match="bad2"):
        nxd.save_checkpoint(str(tmp_path), "next", model=model)  # surfaces at the next call
    assert nxd.load_checkpoint(str(tmp_path), model=TinyNet()) == "good"


def test_sync_failure_never_deletes_last_good(tmp_path):
    register_storage("failing", FailingStorage)
    model, _, _ = _trained()
    nxd.save_checkpoint(str(tmp_path), "good", model=model, user_content="good")
    with pytest.raises(CheckpointError, match=r"No space left on device.*dp_rank_00_tp_rank_00_pp_rank_00\.pt"):
        nxd.save_checkpoint(f"failing://{tmp_path}", "bad", model=model, num_kept_ckpts=1)
    assert (tmp_path / "good" / "done").is_file()
    assert not (tmp_path / "bad" / "done").exists()
    assert nxd.load_checkpoint(str(tmp_path), model=TinyNet()) == "good"
    assert not (tmp_path / "bad").exists()  # the partial was cleaned up by auto-resume


def test_bad_arguments_are_named(tmp_path):
    with pytest.raises(ValueError, match="num_kept_ckpts"):
        nxd.save_checkpoint(str(tmp_path), "a", model=TinyNet(), num_kept_ckpts=0)
    with pytest.raises(ValueError, match="tag"):
        nxd.save_checkpoint(str(tmp_path), "a/b", model=TinyNet())


class _Adapted(torch.nn.Module):
    """A model wrapped by an adapter as nxd-lora's LoRAModel (and PEFT, NxD) wraps it: the base under
    ``module.``, returned by ``get_base_model()``, plus the adapter's own parameter."""

    def __init__(self, base: torch.nn.Module) -> None:
        super().__init__()
        self.module, self.adapter = base, torch.nn.Parameter(torch.zeros(3))

    def get_base_model(self) -> torch.nn.Module:
        return self.module


def test_plain_checkpoint_loads_into_the_base_of_an_adapted_model(tmp_path):
    model, _, _ = _trained()
    nxd.save_checkpoint(str(tmp_path), "pretrained", model=model)
    adapted = _Adapted(_fresh()[0])
    with pytest.warns(UserWarning, match=r"left 1 model tensor.*\['adapter'\]"):
        nxd.load_checkpoint(str(tmp_path), "pretrained", model=adapted, strict=False)
    _assert_same_state(model.state_dict(), adapted.module.state_dict())
    with pytest.raises(CheckpointError, match="adapter"):
        nxd.load_checkpoint(str(tmp_path), "pretrained", model=_Adapted(_fresh()[0]))
    # saved from the adapted model: its own names, as they are
    nxd.save_checkpoint(str(tmp_path), "adapted", model=adapted)
    again = _Adapted(_fresh()[0])
    nxd.load_checkpoint(str(tmp_path), "adapted", model=again)
    _assert_same_state(adapted.state_dict(), again.state_dict())


class _Unprefixed(torch.nn.Module):
    """A wrapper whose state_dict drops its own prefix (as NxDModel's does)."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def state_dict(self, *args, **kwargs):
        return self.inner.state_dict(*args, **kwargs)


def test_shards_inside_a_prefix_dropping_wrapper_are_recorded_sharded():
    from nxd_ckpt.metadata import shardings_of

    outer = torch.nn.Module()
    outer.model = _Unprefixed(torch.nn.Linear(4, 2))
    outer.model.inner.weight.tensor_model_parallel, outer.model.inner.weight.partition_dim = True, 0
    shardings = shardings_of(outer, outer.state_dict())
    assert "model.weight" in outer.state_dict() and shardings["model.weight"].dim == 0
    assert shardings["model.inner.weight"].dim == 0 and shardings["model.bias"] is None
