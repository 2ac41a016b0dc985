"""The resume checks ``nxd train`` makes before launch (``preflight._resume_layout``), in process:
the checkpoint's ``metadata.json`` is verified against its ``done`` digest before its degrees are
believed (an edited one is refused naming the file and the key), and the DP-size rule is the one
``loop._restore`` applies (``resume_rules.data_position_refusal``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nxd import ConfigError
from nxd_ckpt.layout import done_payload
from nxd_ckpt.metadata import write_metadata
from nxd_ckpt.storage import LocalStorage
from nxd_training.config import parse_config
from nxd_training.preflight import _resume_layout
from nxd_training.resume_rules import data_position_refusal


def test_resume_layout_verifies_metadata_before_using_it(make_config, tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"  # what a save leaves: metadata.json and the `done` vouching for its digest
    storage = LocalStorage(str(ckpt))
    digest = write_metadata(storage, "step_3", {"degrees": {"tp": 1, "pp": 1, "dp": 2, "ep": 1, "world": 2}})
    (ckpt / "step_3" / "done").write_bytes(done_payload(digest))
    config = parse_config(make_config(distributed_strategy={"tensor_model_parallel_size": 1},
                                      exp_manager={"resume_from_checkpoint": str(ckpt / "step_3")}))
    _resume_layout(config, tmp_path / "runs", dp=2)  # weights and optimizer saved at TP 1: fine

    meta_file = ckpt / "step_3" / "metadata.json"
    meta = json.loads(meta_file.read_text())
    meta["degrees"]["tp"] = 2  # edited after the save: before, believed (a wrong refusal or none)
    meta_file.write_text(json.dumps(meta))
    with pytest.raises(ConfigError, match=rf"exp_manager.resume_from_checkpoint: {meta_file}: content checksum"):
        _resume_layout(config, tmp_path / "runs", dp=2)


def test_one_data_position_rule() -> None:
    assert data_position_refusal(None, 2, "x") is None and data_position_refusal(2, 2, "x") is None
    assert data_position_refusal(4, 2, "ckpt") == ("ckpt was written with 4 data-parallel ranks and this run has 2: "
                                                   "the data position cannot continue exactly")
