"""Bad files and killed processes: errors name the file; partial saves never win."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from ckpt_helpers import TinyNet, register_storage

import nxd
from nxd_ckpt import Checkpointer, CheckpointError, CorruptCheckpointError, TorchFormat
from nxd_ckpt.storage import LocalStorage

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
    payload = tmp_path / "a" / "user_content.pt"
    torch.save({"user": _Payload(str(marker))}, payload)
    with pytest.raises(CorruptCheckpointError, match=r"user_content\.pt: content checksum mismatch"):
        nxd.load_checkpoint(str(tmp_path), "a", model=TinyNet())
    with open(payload, "rb") as f, pytest.raises(CorruptCheckpointError, match=r"user_content\.pt.*refused"):
        TorchFormat().load(f, str(payload))  # the safe loader refuses it even without a checksum
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
        deadline = time.monotonic() + 180  # a loaded CI host starts python+torch slowly
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


# ---------------------------------------------------------------- checksums and shard checks (item 2)
def _flip(path: Path, offset_from_end: int = 40) -> None:
    data = bytearray(path.read_bytes())
    data[-offset_from_end] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("fmt", ["torch", "safetensors"])
def test_flipped_byte_in_a_tensor_file_fails_naming_it(tmp_path, fmt):
    nxd.save_checkpoint(str(tmp_path), "a", model=TinyNet(), format=fmt)
    name = MODEL_FILE.replace(".pt", ".safetensors" if fmt == "safetensors" else ".pt")
    path = tmp_path / "a" / "model" / name
    # safetensors: the last tensor's bytes; torch: inside the zip's data records, not its directory
    _flip(path, 4 if fmt == "safetensors" else path.stat().st_size // 2)
    with pytest.raises(CorruptCheckpointError, match=f"{name}: content checksum mismatch"):
        nxd.load_checkpoint(str(tmp_path), "a", model=TinyNet())


def test_altered_safetensors_header_fails_naming_the_file(tmp_path):
    nxd.save_checkpoint(str(tmp_path), "a", model=TinyNet(), format="safetensors")
    path = tmp_path / "a" / "model" / "dp_rank_00_tp_rank_00_pp_rank_00.safetensors"
    original = path.read_bytes()
    for old, new in ((b'"F32"', b'"I32"'), (b'"data_offsets":[0,', b'"data_offsets":[4,')):
        assert old in original
        path.write_bytes(original.replace(old, new, 1))
        with pytest.raises(CorruptCheckpointError, match=f"{path.name}: content checksum mismatch"):
            nxd.load_checkpoint(str(tmp_path), "a", model=TinyNet())


def test_shard_dtype_is_checked_against_metadata_without_checksums(tmp_path):
    """A checkpoint saved before checksums existed (no 'files', no digest in 'done') still has
    each shard's dtype and shape checked against metadata.json."""
    nxd.save_checkpoint(str(tmp_path), "a", model=TinyNet(), format="safetensors")
    meta_path = tmp_path / "a" / "metadata.json"
    meta = json.loads(meta_path.read_text())
    del meta["files"]
    meta_path.write_text(json.dumps(meta))
    (tmp_path / "a" / "done").write_text(json.dumps({"completed_ns": 1}))
    path = tmp_path / "a" / "model" / "dp_rank_00_tp_rank_00_pp_rank_00.safetensors"
    path.write_bytes(path.read_bytes().replace(b'"F32"', b'"I32"', 1))
    with pytest.raises(CorruptCheckpointError, match=f"{path.name}: tensor .* is int32 .* records float32"):
        nxd.load_checkpoint(str(tmp_path), "a", model=TinyNet())


def test_swapped_tp_shard_files_fail_naming_both(rank_pool, tmp_path):
    from test_reshard_ranks import save_body

    from nxd_ckpt import full_model_state

    rank_pool(2).run(save_body, str(tmp_path), 2, 1, "tp2")
    model = tmp_path / "tp2" / "model"
    a, b = model / "dp_rank_00_tp_rank_00_pp_rank_00.pt", model / "dp_rank_00_tp_rank_01_pp_rank_00.pt"
    assert full_model_state(str(tmp_path), "tp2")  # intact: loads
    data_a, data_b = a.read_bytes(), b.read_bytes()
    a.write_bytes(data_b)
    b.write_bytes(data_a)
    with pytest.raises(CorruptCheckpointError, match=f"{a.name}: content checksum mismatch.*content is that of .*{b.name}"):
        full_model_state(str(tmp_path), "tp2")


# ---------------------------------------------------------------- clear errors (item 4)
def test_random_bytes_are_called_corrupt_not_code(tmp_path):
    path = tmp_path / "random.pt"
    path.write_bytes(os.urandom(4096))
    with open(path, "rb") as f, pytest.raises(CorruptCheckpointError, match="not a torch checkpoint") as err:
        TorchFormat().load(f, str(path))
    assert "code" not in str(err.value)


def test_deleted_optimizer_shard_is_named(tmp_path):
    model = TinyNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    nxd.save_checkpoint(str(tmp_path), "a", model=model, optimizer=opt)
    (tmp_path / "a" / "optim" / MODEL_FILE).unlink()
    with pytest.raises(CheckpointError, match=f"optim/{MODEL_FILE}: missing .*metadata.json records it") as err:
        nxd.load_checkpoint(str(tmp_path), "a", model=TinyNet(), optimizer=opt)
    assert "reshard" not in str(err.value)


def test_wrong_tp_in_metadata_is_named(tmp_path):
    _saved(tmp_path)
    meta_path = tmp_path / "a" / "metadata.json"
    meta_path.write_text(meta_path.read_text().replace('"tp": 1', '"tp": 2'))
    with pytest.raises(CorruptCheckpointError, match="metadata.json: content checksum mismatch"):
        nxd.load_checkpoint(str(tmp_path), "a", model=TinyNet())


def test_deleted_user_content_is_named(tmp_path):
    _saved(tmp_path)
    (tmp_path / "a" / "user_content.pt").unlink()
    with pytest.raises(CheckpointError, match="user_content.pt: missing"):
        nxd.load_checkpoint(str(tmp_path), "a", model=TinyNet())


def test_deleted_metadata_does_not_skip_the_rng_restore_silently(tmp_path):
    _saved(tmp_path)
    (tmp_path / "a" / "metadata.json").unlink()
    with pytest.raises(CheckpointError, match="metadata.json: missing.*RNG"):
        nxd.load_checkpoint(str(tmp_path), "a", model=TinyNet())


class DevFullStorage(LocalStorage):
    """Model files go to /dev/full: the kernel answers ENOSPC, as a full disk does."""

    def __init__(self, root: str, options: dict | None = None) -> None:
        super().__init__(root[len("devfull://"):], options)

    @contextlib.contextmanager
    def open_write(self, path: str):
        if "/model/" not in path:
            with super().open_write(path) as f:
                yield f
            return
        with open("/dev/full", "wb") as f:
            yield f
            f.flush()


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_disk_full_names_the_cause(tmp_path):
    register_storage("devfull", DevFullStorage)
    big = torch.nn.Linear(256, 256)  # more than one write buffer, so the error comes mid-file
    with pytest.raises(CheckpointError, match="No space left on device") as err:
        nxd.save_checkpoint(f"devfull://{tmp_path}", "a", model=big)
    assert "unexpected pos" not in str(err.value)
    # the kernel's ENOSPC on write() names no file: the error names the one being written
    assert f"writing {tmp_path}/a/model/dp_rank_00_tp_rank_00_pp_rank_00.pt failed" in str(err.value), err.value
    assert not (tmp_path / "a" / "done").exists()


def test_convert_unknown_tag_says_not_found(tmp_path, capsys):
    from nxd.cli import main

    _saved(tmp_path)
    assert main(["ckpt", "convert", "--from", "nxd", "--to", "full", "--input", str(tmp_path), "--tag", "nope",
                 "--output", str(tmp_path / "o.pt")]) == 1
    assert "checkpoint tag 'nope' not found" in capsys.readouterr().err


def test_list_of_a_file_or_empty_dir_is_an_error(tmp_path, capsys):
    from nxd.cli import main

    path = _saved(tmp_path)
    assert main(["ckpt", "list", str(path)]) == 1
    assert "is a file" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["ckpt", "list", str(tmp_path / "empty")]) == 1
    assert "no checkpoints" in capsys.readouterr().err


# ---------------------------------------------------------------- whole but unmarked (item 3)
def test_checkpoint_missing_only_done_is_kept_warned_and_resumable_after_verify(tmp_path, capsys):
    from nxd.cli import main

    torch.manual_seed(1)
    nxd.save_checkpoint(str(tmp_path), "step_1", model=TinyNet(), user_content={"step": 1})
    torch.manual_seed(2)
    nxd.save_checkpoint(str(tmp_path), "step_2", model=TinyNet(), user_content={"step": 2})
    (tmp_path / "step_2" / "done").unlink()
    with pytest.warns(UserWarning, match="step_2 has every file .* no 'done' marker.*--mark-done"):
        assert nxd.load_checkpoint(str(tmp_path), model=TinyNet(), load_rng=False) == {"step": 1}
    assert (tmp_path / "step_2").is_dir()  # auto-resume did not remove it
    # the next run (a fresh checkpointer: it did not save step_2) saves with save_top_k=1
    Checkpointer().save(str(tmp_path), "step_3", model=TinyNet(), user_content={"step": 3}, num_kept_ckpts=1,
                       context=None)  # one process: no parallel context
    assert (tmp_path / "step_2").is_dir()  # retention did not remove what this run did not save
    assert not (tmp_path / "step_1").exists()
    with pytest.raises(CheckpointError, match="every file is there.*nxd ckpt verify"):
        nxd.load_checkpoint(str(tmp_path), "step_2", model=TinyNet())
    _flip(tmp_path / "step_2" / "model" / MODEL_FILE, 200)
    assert main(["ckpt", "verify", str(tmp_path), "--tag", "step_2", "--mark-done"]) == 1
    assert "content checksum mismatch" in capsys.readouterr().err
    assert not (tmp_path / "step_2" / "done").exists()  # a bad checkpoint is never marked
    _flip(tmp_path / "step_2" / "model" / MODEL_FILE, 200)
    assert main(["ckpt", "verify", str(tmp_path), "--tag", "step_2", "--mark-done"]) == 0
    assert "marked complete" in capsys.readouterr().out
    model = TinyNet()
    assert nxd.load_checkpoint(str(tmp_path), "step_2", model=model) == {"step": 2}
    torch.manual_seed(2)
    assert torch.equal(model.fc1.weight, TinyNet().fc1.weight)
