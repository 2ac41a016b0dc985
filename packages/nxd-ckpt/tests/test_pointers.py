"""The pointers a reader trusts never lie: a ``done`` marker is verified like the metadata it guards,
and ``newest`` never names a missing or incomplete tag (readers fall back to the newest complete one,
by the ``done`` markers, with one warning)."""

from __future__ import annotations

import errno
import subprocess
import sys
from pathlib import Path

import pytest
from ckpt_helpers import TinyNet

import nxd
from nxd_ckpt import CorruptCheckpointError
from nxd_ckpt.storage import LocalStorage


def _cli(*args: str) -> subprocess.CompletedProcess:
    code = "import sys; from nxd.cli import main; sys.exit(main())"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300)


def test_a_garbage_done_marker_is_not_trusted(tmp_path: Path) -> None:
    nxd.save_checkpoint(str(tmp_path), "a", model=TinyNet(), user_content={"step": 1})
    nxd.save_checkpoint(str(tmp_path), "b", model=TinyNet(), user_content={"step": 2})
    (tmp_path / "b" / "done").write_bytes(b"\x00garbage")
    with pytest.warns(UserWarning, match=r"b/done: not a 'done' marker nxd or NxD writes .* treated as incomplete"):
        assert nxd.load_checkpoint(str(tmp_path), model=TinyNet()) == {"step": 1}  # the newest complete one
    with pytest.raises(CorruptCheckpointError, match=r"b/done: not a 'done' marker"):
        nxd.load_checkpoint(str(tmp_path), "b", model=TinyNet())
    out = _cli("ckpt", "inspect", str(tmp_path), "--tag", "b")  # as a user does
    assert out.returncode != 0 and "b/done: not a 'done' marker nxd or NxD writes" in out.stderr + out.stdout, out
    assert "Traceback" not in out.stderr


def test_newest_never_names_a_deleted_tag_after_enospc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    nxd.save_checkpoint(str(tmp_path), "a", model=TinyNet(), user_content={"step": 1}, num_kept_ckpts=1)
    assert (tmp_path / "newest").read_text() == "a"
    real = LocalStorage.open_write

    def full_disk(self, path: str):
        if path == "newest":
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, path)

    monkeypatch.setattr(LocalStorage, "open_write", full_disk)
    with pytest.warns(UserWarning, match="could not update .*newest .*No space left on device.*removed it"):
        nxd.save_checkpoint(str(tmp_path), "b", model=TinyNet(), user_content={"step": 2}, num_kept_ckpts=1)
    assert not (tmp_path / "a").exists()  # retention removed 'a' ...
    assert not (tmp_path / "newest").exists()  # ... and nothing names it
    monkeypatch.undo()
    # a stale pointer left by older code: the reader warns and takes the newest complete tag
    (tmp_path / "newest").write_text("a")
    with pytest.warns(UserWarning, match=r"newest names 'a', which does not exist; using the newest complete "
                                         r"checkpoint 'b'"):
        assert nxd.load_checkpoint(str(tmp_path), model=TinyNet()) == {"step": 2}


def test_a_pointer_warning_is_printed_by_one_rank_per_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every rank of a node reads the same checkpoints: the warning comes from local rank 0 only
    (a resume printed each warning once per rank)."""
    import warnings

    from nxd_ckpt import layout

    nxd.save_checkpoint(str(tmp_path), "a", model=TinyNet(), user_content={"step": 1})
    (tmp_path / "newest").write_text("gone")
    monkeypatch.setattr(layout, "_warned", set())
    monkeypatch.setenv("LOCAL_RANK", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning fails the test
        assert nxd.load_checkpoint(str(tmp_path), model=TinyNet()) == {"step": 1}
    monkeypatch.setenv("LOCAL_RANK", "0")
    with pytest.warns(UserWarning, match="newest names 'gone', which does not exist"):
        assert nxd.load_checkpoint(str(tmp_path), model=TinyNet()) == {"step": 1}


def test_a_kill_during_retention_leaves_a_leftover_not_a_checkpoint_to_verify(tmp_path: Path) -> None:
    """Battery: `nxd train` SIGKILLed while retention deleted an old tag (after its `done`, before
    its files) left a tag every resume warned about ("has every file ... verify it first") and
    retention kept forever. Retention marks the tag retired first: the leftover is removed."""
    from nxd_ckpt.retention import delete_checkpoint, remove_incomplete
    from nxd_ckpt.verify import unmarked_checkpoints

    nxd.save_checkpoint(str(tmp_path), "a", model=TinyNet(), user_content={"step": 1})
    nxd.save_checkpoint(str(tmp_path), "b", model=TinyNet(), user_content={"step": 2})

    class KilledMidDelete(LocalStorage):
        def remove_tree(self, path: str) -> None:
            raise KeyboardInterrupt  # the process dies here

    with pytest.raises(KeyboardInterrupt):
        delete_checkpoint(KilledMidDelete(str(tmp_path)), "a")
    storage = LocalStorage(str(tmp_path))
    assert unmarked_checkpoints(storage) == []  # not presented as progress to verify
    assert remove_incomplete(storage) == ["a"]  # the next resume's clean-up takes it
    assert nxd.load_checkpoint(str(tmp_path), model=TinyNet()) == {"step": 2}
