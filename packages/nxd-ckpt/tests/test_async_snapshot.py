"""Async save: the call only snapshots (no file I/O on the training thread), snapshot buffers are
reused across saves, and later steps never leak into a snapshot even while a save is in flight."""

from __future__ import annotations

import contextlib
import threading
import time

import pytest
import torch
from ckpt_helpers import TinyNet, register_storage

import nxd
from nxd_ckpt.storage import LocalStorage


class RecordingStorage(LocalStorage):
    """A local disk that records which thread does each operation, and writes slowly."""

    calls: list[tuple[str, str]] = []
    delay = 0.0

    def __init__(self, root: str, options: dict | None = None) -> None:
        super().__init__(root[len("recording://"):], options)

    def _note(self, op: str) -> None:
        RecordingStorage.calls.append((op, threading.current_thread().name))

    @contextlib.contextmanager
    def open_write(self, path: str):
        self._note("open_write")
        time.sleep(self.delay)
        with super().open_write(path) as f:
            yield f

    def exists(self, path: str) -> bool:
        self._note("exists")
        return super().exists(path)

    def list_dirs(self, path: str) -> list[str]:
        self._note("list_dirs")
        return super().list_dirs(path)

    def remove_file(self, path: str) -> None:
        self._note("remove_file")
        super().remove_file(path)

    def remove_tree(self, path: str) -> None:
        self._note("remove_tree")
        super().remove_tree(path)


def _step(model: TinyNet, opt: torch.optim.Optimizer) -> None:
    model(torch.randn(5, 4)).square().mean().backward()
    opt.step()
    opt.zero_grad()
    with torch.no_grad():
        model.steps += 1


def _state(model: TinyNet, opt: torch.optim.Optimizer) -> dict:
    return {"model": {k: v.clone() for k, v in model.state_dict().items()},
            "exp_avg": [opt.state[p]["exp_avg"].clone() for p in model.parameters()]}


def _loaded(path: str, tag: str) -> dict:
    model = TinyNet()
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    nxd.load_checkpoint(path, tag, model=model, optimizer=opt, load_rng=False)
    return _state(model, opt)


def _assert_equal(a: dict, b: dict) -> None:
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    for x, y in zip(a["exp_avg"], b["exp_avg"]):
        assert torch.equal(x, y)


@pytest.mark.parametrize("overlap", [False, True], ids=["copy-in-call", "overlapped"])
def test_async_call_does_no_file_io_and_steps_never_leak(tmp_path, overlap):
    register_storage("recording", RecordingStorage)
    url = f"recording://{tmp_path}"
    torch.manual_seed(0)
    model = TinyNet()
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    _step(model, opt)
    RecordingStorage.calls, RecordingStorage.delay = [], 0.05  # writes are still running at the next save
    expected = {}
    try:
        for tag in ("a", "b", "c"):
            expected[tag] = _state(model, opt)
            nxd.save_checkpoint(url, tag, model=model, optimizer=opt, user_content={"tag": tag},
                                async_save=True, num_kept_ckpts=2, overlap_snapshot=overlap)
            for _ in range(2):  # training goes on while the save is written
                _step(model, opt)
        nxd.finalize_checkpoint()
    finally:
        RecordingStorage.delay = 0.0
    assert RecordingStorage.calls, "the recording storage was not used"
    on_caller = [op for op, thread in RecordingStorage.calls if thread != "nxd-ckpt-writer"]
    assert on_caller == [], f"storage operations on the training thread: {on_caller}"
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["b", "c"]
    for tag in ("b", "c"):  # 'c' reused the buffers 'b' was written from
        _assert_equal(_loaded(str(tmp_path), tag), expected[tag])
    assert not torch.equal(expected["b"]["model"]["fc1.weight"], model.fc1.weight.detach())


def test_snapshot_buffers_are_reused_across_saves(tmp_path):
    torch.manual_seed(0)
    model = TinyNet()
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    _step(model, opt)
    buffers = nxd.get_checkpointer()._buffers
    nxd.save_checkpoint(str(tmp_path), "a", model=model, optimizer=opt, async_save=True)
    first = {id(b): b.data_ptr() for b in buffers._buffers.values()}
    _step(model, opt)
    nxd.save_checkpoint(str(tmp_path), "b", model=model, optimizer=opt, async_save=True)
    second = {id(b): b.data_ptr() for b in buffers._buffers.values()}
    assert first == second and len(first) > 0  # the same tensors, same memory: no new allocation
    nxd.finalize_checkpoint()
    assert buffers.nbytes == 0  # finalize frees them


def test_overlapped_snapshot_holds_the_state_of_the_save_call(tmp_path):
    """The copy runs on the writer thread; the optimizer step right after the call waits for it (once),
    and a buffer changed outside the optimizer was copied in the call."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.Linear(1024, 8))
    model.register_buffer("seen", torch.zeros(4))
    opt = torch.optim.SGD(model.parameters(), lr=1.0, momentum=0.9)
    waits: list[float] = []
    for tag in ("a", "b"):
        model(torch.randn(2, 1024)).sum().backward()
        opt.step()
        expected = {k: v.clone() for k, v in model.state_dict().items()}
        expected_momentum = [opt.state[p]["momentum_buffer"].clone() for p in model.parameters()]
        nxd.save_checkpoint(str(tmp_path), tag, model=model, optimizer=opt, async_save=True, save_rng=False,
                            overlap_snapshot=True, on_snapshot_wait=waits.append)
        model.seen += 1  # not a parameter: must not leak into the snapshot
        opt.step()  # changes every parameter and momentum buffer at once: waits for the copy first
        opt.step()
    nxd.finalize_checkpoint()
    assert len(waits) == 2 and all(w >= 0 for w in waits), waits  # one wait per save, at its first step
    loaded = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.Linear(1024, 8))
    loaded.register_buffer("seen", torch.zeros(4))
    lopt = torch.optim.SGD(loaded.parameters(), lr=1.0, momentum=0.9)
    nxd.load_checkpoint(str(tmp_path), "b", model=loaded, optimizer=lopt, load_rng=False)
    for k, v in loaded.state_dict().items():
        assert torch.equal(v, expected[k]), k
    for p, m in zip(loaded.parameters(), expected_momentum):
        assert torch.equal(lopt.state[p]["momentum_buffer"], m)


def test_overlapped_snapshot_needs_async_save(tmp_path):
    with pytest.raises(ValueError, match="overlap_snapshot=True needs async_save=True"):
        nxd.save_checkpoint(str(tmp_path), "a", model=torch.nn.Linear(2, 2), overlap_snapshot=True)


EXIT_SCRIPT = """
import sys, torch, nxd
sys.path.insert(0, {tests!r})
from ckpt_helpers import TinyNet
torch.manual_seed(3)
nxd.save_checkpoint({path!r}, "last", model=TinyNet(), user_content="last", async_save=True)
"""  # the program ends right after the call, with the save in flight


def test_normal_exit_waits_for_the_in_flight_save(tmp_path):
    import os
    import subprocess
    import sys

    script = EXIT_SCRIPT.format(tests=os.path.dirname(os.path.abspath(__file__)), path=str(tmp_path))
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    model = TinyNet()
    assert nxd.load_checkpoint(str(tmp_path), model=model, load_rng=False) == "last"
    torch.manual_seed(3)
    assert torch.equal(model.fc1.weight, TinyNet().fc1.weight)
