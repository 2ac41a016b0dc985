"""Inputs refused before launch with a message that says what is wrong (issue 36): a directory
given as the config file, a tokenizer path that does not exist, ``save_top_k: 0`` on a run that
saves checkpoints, and an unknown ``checkpoint_format`` with checkpointing off."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from nxd.cli import main


def _refused(capsys, *argv: str) -> str:
    assert main(["train", *argv, "--validate"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


def test_a_directory_as_the_config_file(tmp_path: Path, capsys) -> None:
    err = _refused(capsys, str(tmp_path))
    assert f"config file '{tmp_path}' is a directory; give the YAML file in it" in err


@pytest.mark.parametrize(("overrides", "message"), [
    (["data.tokenizer=/nonexistent/tokenizer.json"], "data.tokenizer: /nonexistent/tokenizer.json does not exist"),
    (["exp_manager.create_checkpoint_callback=true", "exp_manager.checkpoint_callback_params.save_top_k=0"],
     "save_top_k=0 would keep no checkpoint of a run that saves them: set exp_manager.create_checkpoint_callback=false"),
    (["exp_manager.create_checkpoint_callback=false", "exp_manager.checkpoint_format=pickle"],
     "exp_manager.checkpoint_format=pickle"),
    # issue 43: names that would become paths outside the run (before: accepted; filename then failed every
    # rank at the first save with "checkpoint tag must be a non-empty name without '/'", naming no key)
    (["exp_manager.checkpoint_callback_params.filename=../../escaped"],
     "exp_manager.checkpoint_callback_params.filename: the checkpoint tag it forms ('../../escaped') must be one "
     "name, without '/'"),
    (["exp_manager.name=../../x"], "exp_manager.name='../../x' must be one name"),
    (["exp_manager.name=/abs/x"], "exp_manager.name='/abs/x' must be one name"),
    (["exp_manager.version=.."], "exp_manager.version='..' must not be '.' or '..'"),
])
def test_refused_before_launch(make_config, tmp_path: Path, capsys, overrides: list[str], message: str) -> None:
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(make_config()))
    assert message in _refused(capsys, str(path), *overrides)
