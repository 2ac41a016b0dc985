"""DCP integrity (issue 43): ``save_dcp`` records every file's CRC-32 in ``nxd_checksums.json`` and
``load_dcp`` checks each file as DCP reads it (one pass) and stops the load naming it; a damaged file is named (never torch's
``weights_only=False`` advice, ``AssertionError`` or "checkpoint file is corrupted"); a folder written
by plain torch loads with a one-line note that it is unverified; ENOSPC names the file. Before this
change a flipped byte in a ``.distcp`` loaded silently. Real gloo ranks (2), real files."""

from __future__ import annotations

import errno
import json
import os
import shutil
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from test_dcp import setup

from nxd_fsdp.dcp import load_dcp, save_dcp


def save_body(path: str) -> None:
    ctx, model, opt = setup()
    save_dcp(path, model, opt, context=ctx)


def load_body(path: str) -> tuple[str, list[str]]:
    """The error (or 'ok') and the warnings of a load, as this rank saw them."""
    ctx, model, opt = setup()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            load_dcp(path, model, opt, context=ctx)
            outcome = "ok"
        except Exception as exc:  # noqa: BLE001 - the test reads the message
            outcome = f"{type(exc).__name__}: {exc}"
    return outcome, [str(w.message) for w in caught if "unverified" in str(w.message)]


def full_disk_body(path: str) -> str:
    """A save whose first write past 2 KiB of a .distcp meets ENOSPC (the kernel's error, no file name)."""
    from torch.distributed.checkpoint.filesystem import FileSystem

    real = FileSystem.create_stream

    class Full:
        def __init__(self, raw):
            self.raw, self.n = raw, 0

        def write(self, data):
            self.n += memoryview(data).nbytes
            if self.n > 2048:
                raise OSError(errno.ENOSPC, "No space left on device")
            return self.raw.write(data)

        def __getattr__(self, name):
            return getattr(self.raw, name)

    from contextlib import contextmanager

    @contextmanager
    def create_stream(self, p, mode):
        with real(self, p, mode) as raw:
            yield Full(raw) if "w" in mode and str(p).endswith(".distcp") else raw

    FileSystem.create_stream = create_stream
    try:
        ctx, model, opt = setup()
        save_dcp(path, model, opt, context=ctx)
        return "saved"
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {exc}"
    finally:
        FileSystem.create_stream = real


def _loaded(pool, path: str) -> tuple[str, list[str]]:
    results = pool.run(load_body, path)
    assert results[0][0] == results[1][0], results  # every rank stops with the same line
    assert "weights_only" not in results[0][0] and "AssertionError" not in results[0][0]
    return results[0][0], results[0][1] + results[1][1]


def test_dcp_checksums_name_the_damaged_file(rank_pool, tmp_path: Path) -> None:
    pool = rank_pool(2)
    run = str(tmp_path / "run")
    pool.run(save_body, run)
    manifest = json.loads((Path(run) / "nxd_checksums.json").read_text())["files"]
    assert sorted(manifest) == [".metadata", "__0_0.distcp", "__1_0.distcp"], manifest
    assert _loaded(pool, run) == ("ok", [])

    bad = str(tmp_path / "flipped")
    shutil.copytree(run, bad)
    shard = Path(bad) / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 1  # one flipped byte inside a tensor: before, loaded without error
    shard.write_bytes(bytes(data))
    outcome, _ = _loaded(pool, bad)
    assert f"{shard}: content checksum mismatch" in outcome and "the load stopped there" in outcome, outcome

    a, b = Path(bad) / "__0_0.distcp", shard
    shutil.copyfile(Path(run) / "__1_0.distcp", a)
    shutil.copyfile(Path(run) / "__0_0.distcp", b)
    outcome, _ = _loaded(pool, bad)
    assert f"{a}: content checksum mismatch" in outcome and f"its content is that of {b}" in outcome, outcome

    shutil.copyfile(Path(run) / "__0_0.distcp", a)
    (Path(bad) / ".metadata").write_bytes(b"garbage" * 10)
    outcome, _ = _loaded(pool, bad)
    assert f"{Path(bad) / '.metadata'}: content checksum mismatch" in outcome, outcome

    outcome = pool.run(full_disk_body, str(tmp_path / "full"))
    assert all("no space left on device" in o and ".distcp" in o for o in outcome), outcome
    assert not (tmp_path / "full").exists()


def test_a_foreign_dcp_folder_loads_unverified_and_damage_is_named(rank_pool, tmp_path: Path) -> None:
    pool = rank_pool(2)
    run = str(tmp_path / "run")
    pool.run(save_body, run)
    foreign = tmp_path / "foreign"  # what torch writes: one process, no manifest
    state = {k: torch.empty_like(v) for k, v in __import__("fsdp_models").build().state_dict().items()}
    dcp.load(state, checkpoint_id=run)
    dcp.save(state, checkpoint_id=str(foreign))
    outcome, notes = _loaded(pool, str(foreign))
    # the optimizer state is not in it: DCP itself says which key is missing (a named, one-line error)
    assert "optimizer" in outcome, outcome
    assert len(notes) == 1 and "no nxd_checksums.json" in notes[0] and "loading it unverified" in notes[0], notes

    (foreign / "nxd_checksums.json").unlink(missing_ok=True)
    os.remove(Path(run) / "nxd_checksums.json")  # the 2-rank folder, as torch itself writes it
    shard = Path(run) / "__1_0.distcp"
    shard.write_bytes(shard.read_bytes()[:100])
    outcome, _ = _loaded(pool, run)
    assert f"{shard}: truncated: it has 100 bytes" in outcome, outcome
    (Path(run) / ".metadata").write_bytes(b"\x80\x04garbage")
    outcome, _ = _loaded(pool, run)
    assert f"{Path(run) / '.metadata'}: not a DCP metadata file" in outcome, outcome


@pytest.mark.parametrize("payload", [b"cos\nsystem\n(S'echo pwned'\ntR."])
def test_dcp_metadata_is_not_unpickled_blindly(tmp_path: Path, payload: bytes) -> None:
    from nxd_core_parallel.dcp_integrity import DcpCheckpointError, read_metadata

    (tmp_path / ".metadata").write_bytes(payload)
    with pytest.raises(DcpCheckpointError, match=r"\.metadata: not a DCP metadata file .*os\.system"):
        read_metadata(str(tmp_path))


def test_dcp_files_are_hashed_in_the_one_read_that_loads_them(tmp_path: Path, monkeypatch) -> None:
    """In process: the writer hashes while DCP writes and syncs (nxd-ckpt's one hashing writer), the
    reader hashes the bytes DCP reads into the tensors (no second read of any file: ``file_digest``,
    the re-read, is never called), and a flipped byte inside a tensor's bytes stops the load naming
    the file."""
    from torch.distributed.checkpoint.api import CheckpointException

    import nxd_core_parallel.dcp_verified_read as verified
    from nxd_core_parallel.dcp_integrity import DigestingWriter, SafeReader, record_manifest, verify_dcp
    from nxd_core_parallel.file_checksums import ChecksumError, file_digest

    state = {f"w{i}": torch.randn(300_000 + i) for i in range(3)}  # > 1 MiB each: hashed while synced
    state["small"] = torch.arange(7.0)
    folder = str(tmp_path / "dcp")
    writer = DigestingWriter(folder)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DCP's "no process group: one process" note
        dcp.save(state, storage_writer=writer)
    record_manifest(folder, writer, "nxd_fsdp.save_dcp")
    files = verify_dcp(folder)
    assert all(file_digest(os.path.join(folder, n)) == d for n, d in files.items())  # the streamed digests

    monkeypatch.setattr(verified, "file_digest", lambda where: pytest.fail(f"{where} read a second time"))
    loaded = {k: torch.zeros_like(v) for k, v in state.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(loaded, storage_reader=SafeReader(folder, files))
    assert all(torch.equal(loaded[k], v) for k, v in state.items())

    shard = next(Path(folder).glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 1
    shard.write_bytes(bytes(data))
    with pytest.raises(CheckpointException) as caught, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(loaded, storage_reader=SafeReader(folder, files))
    found = caught.value.failures[0][0]  # DCP wraps each rank's error; load_dcp unwraps it
    assert isinstance(found, ChecksumError) and f"{shard}: content checksum mismatch" in str(found), found


def test_a_damaged_metadata_is_one_line_naming_it(tmp_path: Path, caplog) -> None:
    """In process: ``load_dcp`` of a folder whose ``.metadata`` is damaged raises nxd's one error naming
    the file; torch's "Global/Rank local metadata is not found" warnings and their tracebacks (logged on
    the root logger before DCP's own error: printed to stderr outside pytest) are not logged."""
    from nxd_core_parallel.dcp_integrity import DcpCheckpointError, DigestingWriter, record_manifest

    model = torch.nn.Linear(3, 2)
    folder = str(tmp_path / "dcp")
    writer = DigestingWriter(folder)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(model.state_dict(), storage_writer=writer)
    record_manifest(folder, writer, "nxd_fsdp.save_dcp")
    (Path(folder) / ".metadata").write_bytes(b"\x80\x04garbage")
    caplog.set_level("DEBUG")
    with pytest.raises(DcpCheckpointError, match=rf"{Path(folder) / '.metadata'}: content checksum mismatch"):
        load_dcp(folder, model)
    logged = [r.getMessage() for r in caplog.records if r.name == "root"]
    assert not any("metadata is not found" in m for m in logged), logged
