"""Containment (issue 43): nothing nxd-ckpt does reads or writes outside the checkpoint folder it
was given. A ``--tag`` with '..' is refused; a tag folder that is a symbolic link is left alone
(one warning, never retired); markers that are links are not trusted."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest
from ckpt_helpers import TinyNet

import nxd
from nxd.cli import main
from nxd_ckpt import CheckpointError


def test_cli_tag_cannot_leave_the_checkpoint_folder(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    root, outside = tmp_path / "run" / "checkpoints", tmp_path / "x"
    nxd.save_checkpoint(str(root), "a", model=TinyNet())
    nxd.save_checkpoint(str(outside), "c", model=TinyNet())
    (outside / "c" / "done").unlink()  # a whole checkpoint outside the run, unmarked
    for argv in (["ckpt", "verify", str(root), "--tag", "../../x/c", "--mark-done"],
                 ["ckpt", "verify", str(root), "--tag", "/abs", "--mark-done"],
                 ["ckpt", "convert", "--from", "nxd", "--to", "full", "--input", str(root), "--tag", "../../x/c",
                  "--output", str(tmp_path / "o.pt")],
                 ["ckpt", "inspect", str(root), "--tag", "../a"]):
        assert main(argv) == 1, argv
        err = capsys.readouterr().err
        assert "--tag=" in err and "cannot leave it" in err and "Traceback" not in err, err
    assert not (outside / "c" / "done").exists()  # before: verify --mark-done wrote it
    assert not (tmp_path / "o.pt").exists()


def test_a_linked_tag_is_left_alone(tmp_path: Path) -> None:
    root, other = tmp_path / "ckpts", tmp_path / "other_run"
    nxd.save_checkpoint(str(other), "theirs", model=TinyNet())
    nxd.save_checkpoint(str(root), "a", model=TinyNet())
    os.symlink(other / "theirs", root / "linked")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for tag in ("b", "c", "d"):
            nxd.save_checkpoint(str(root), tag, model=TinyNet(), num_kept_ckpts=1)
    linked = [str(w.message) for w in caught if "linked is a symbolic link" in str(w.message)]
    assert len(linked) == 1 and "leaves it alone" in linked[0], [str(w.message) for w in caught]
    assert not any("rmtree" in str(w.message) for w in caught)
    assert (other / "theirs" / "done").exists() and not (other / "theirs" / "retired").exists()  # untouched
    assert sorted(p.name for p in root.iterdir()) == ["d", "linked", "newest"]
    assert main(["ckpt", "list", str(root)]) == 0
    with pytest.raises(CheckpointError, match=r"checkpoint tag='linked': .*linked is a symbolic link .*only inside"):
        nxd.load_checkpoint(str(root), "linked", model=TinyNet())


def test_marker_links_are_not_trusted(tmp_path: Path) -> None:
    nxd.save_checkpoint(str(tmp_path), "a", model=TinyNet(), user_content={"step": 1})
    nxd.save_checkpoint(str(tmp_path), "b", model=TinyNet(), user_content={"step": 2})
    (tmp_path / "b" / "done").unlink()
    os.symlink(tmp_path / "a" / "done", tmp_path / "b" / "done")  # before: trusted, then b's checksum failed
    with pytest.warns(UserWarning, match=r"b/done is a symbolic link \(to .*a/done\), not a marker nxd writes"):
        assert nxd.load_checkpoint(str(tmp_path), model=TinyNet()) == {"step": 1}  # the newest complete one
    assert (tmp_path / "b").is_dir()  # kept (it was committed once), named, never deleted here
    (tmp_path / "newest").unlink()
    os.symlink(tmp_path / "a" / "done", tmp_path / "newest")
    with pytest.warns(UserWarning, match=r"newest is a symbolic link .*ignored"):
        nxd.load_checkpoint(str(tmp_path), model=TinyNet())
    (tmp_path / "newest").unlink()
    (tmp_path / "newest").write_text("../elsewhere")
    with pytest.warns(UserWarning, match=r"newest names '../elsewhere', which is not a tag folder name"):
        nxd.load_checkpoint(str(tmp_path), model=TinyNet())
    # a 'retired' link is no retirement: the whole unmarked tag is kept, not cleaned up as a leftover
    os.symlink(tmp_path / "a" / "done", tmp_path / "b" / "retired")
    (tmp_path / "b" / "done").unlink()
    with pytest.warns(UserWarning, match="has every file its metadata.json records but no 'done' marker"):
        nxd.load_checkpoint(str(tmp_path), model=TinyNet())
    assert (tmp_path / "b" / "metadata.json").exists()
