"""Bad files and killed processes: errors name the file; partial saves never win."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from ckpt_helpers import TinyNet

import nxd
from nxd_ckpt import CheckpointError, CorruptCheckpointError

MODEL_FILE = "dp_rank_00_tp_rank_00_pp_rank_00.pt"


def _saved(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    nxd.save_checkpoint(str(tmp_path), "a", model=TinyNet(), user_content={"ok": 1})
    return tmp_path / "a" / "model" / MODEL_FILE


def test_truncated_file_error_names_the_file(tmp_path):
    path = _saved(tmp_path)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(CorruptCheckpointError, match=MODEL_FILE):
        nxd.load_checkpoint(str(tmp_path), "a", model=TinyNet())


def test_corrupted_safetensors_error_names_the_file(tmp_path):
    nxd.save_checkpoint(str(tmp_path), "s", model=TinyNet(), format="safetensors")
    path = tmp_path / "s" / "model" / "dp_rank_00_tp_rank_00_pp_rank_00.safetensors"
    data = bytearray(path.read_bytes())
    data[:8] = b"\xff" * 8  # header length field
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptCheckpointError, match="dp_rank_00_tp_rank_00_pp_rank_00.safetensors"):
        nxd.load_checkpoint(str(tmp_path), "s", model=TinyNet())


class _Payload:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


def test_pickle_with_code_is_refused(tmp_path):
    _saved(tmp_path)
    marker = tmp_path / "code_ran"
    torch.save({"user": _Payload(str(marker))}, tmp_path / "a" / "user_content.pt")
    with pytest.raises(CorruptCheckpointError, match=r"user_content\.pt.*refused"):
        nxd.load_checkpoint(str(tmp_path), "a", model=TinyNet())
    assert not marker.exists()


def test_corrupted_metadata_is_named(tmp_path):
    _saved(tmp_path)
    (tmp_path / "a" / "metadata.json").write_text("{not json")
    with pytest.raises(CorruptCheckpointError, match="metadata.json"):
        nxd.load_checkpoint(str(tmp_path), "a", model=TinyNet())


def test_missing_shard_is_named(tmp_path):
    path = _saved(tmp_path)
    path.unlink()
    with pytest.raises(CheckpointError, match=MODEL_FILE):
        nxd.load_checkpoint(str(tmp_path), "a", model=TinyNet())


SCRIPT = Path(__file__).with_name("kill_target.py")


@pytest.mark.parametrize("mode", ["sync", "async", "overwrite"])
def test_process_killed_mid_save_leaves_previous_checkpoint(tmp_path, mode):
    ckpt = tmp_path / "ckpt"
    signal_file = tmp_path / "writing"
    proc = subprocess.Popen([sys.executable, str(SCRIPT), str(ckpt), str(signal_file), mode],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 90
        while not signal_file.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the save never started"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    partial = ckpt / (".saving-step_1" if mode == "overwrite" else "step_2")
    assert partial.is_dir() and not (partial / "done").exists()  # killed mid-save
    assert nxd.has_checkpoint(str(ckpt))
    model = TinyNet()
    assert nxd.load_checkpoint(str(ckpt), model=model) == {"step": 1}
    torch.manual_seed(1)
    assert torch.equal(model.fc1.weight, TinyNet().fc1.weight)  # step_1's weights (seed 1)
    assert not partial.exists()  # the partial was cleaned up
    assert sorted(os.listdir(ckpt)) == ["newest", "step_1"]


DYING_JOB = Path(__file__).with_name("dying_rank_job.py")


@pytest.mark.slow
@pytest.mark.parametrize("teardown", ["destroy", "finalize"])
def test_async_save_of_a_dead_rank_is_never_committed(tmp_path, teardown):
    """Rank 1 dies with its async save in flight; rank 0's training thread fails and tears the
    group down (``destroy``: with the writer still running). The save must not be marked done,
    retention (num_kept_ckpts=1) must keep step_1, and auto-resume must use step_1."""
    ckpt, store = tmp_path / "ckpt", tmp_path / "rendezvous"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, str(DYING_JOB), str(ckpt), str(store), str(r), teardown],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env) for r in (0, 1)]
    try:
        outs = [p.communicate(timeout=150)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert procs[1].returncode == 9, outs[1]
    assert procs[0].returncode != 0, outs[0]  # its training step failed when rank 1 died
    assert "rank 1 never died" not in outs[0]
    assert not (ckpt / "step_2" / "done").exists(), outs[0]
    assert (ckpt / "step_1" / "done").exists(), outs[0]
    assert "did not happen" in outs[0], outs[0]  # the lost save is reported
    model = TinyNet()
    assert nxd.load_checkpoint(str(ckpt), model=model, load_rng=False) == {"step": 1}  # auto-resume
    torch.manual_seed(1)
    assert torch.equal(model.fc1.weight, TinyNet().fc1.weight)
