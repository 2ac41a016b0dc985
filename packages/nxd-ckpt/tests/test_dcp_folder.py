"""DCP folders in one process (nxd_ckpt.dcp_folder, ``nxd ckpt convert --from/--to dcp``): a folder in
torchtitan's/nxd-fsdp's layout (model at the top level, the optimizer under ``optimizer``) converts
its model bit-exact and names what it leaves; a ``.metadata`` pickle naming anything but DCP's own
classes is refused before anything in it runs."""

from __future__ import annotations

import os
import pickle

import pytest
import torch
import torch.distributed.checkpoint as dcp

from nxd_ckpt.convert import run_convert
from nxd_ckpt.dcp_folder import read_dcp_model, write_dcp_folder
from nxd_ckpt.errors import CheckpointError


def test_dcp_folder_converts_its_model(tmp_path, capsys):
    state = {"embed.weight": torch.randn(8, 4), "layers.0.w": torch.randn(4, 4)}
    # written by plain DCP as another code base does: the optimizer's state beside the model
    dcp.save({**state, "optimizer": {"state": {"embed.weight": {"exp_avg": torch.ones(8, 4)}}}},
             checkpoint_id=str(tmp_path / "run"), no_dist=True)
    model, groups = read_dcp_model(str(tmp_path / "run"))
    assert groups == {"optimizer"} and model.keys() == state.keys()
    full = run_convert("dcp", "dcp", str(tmp_path / "run"), str(tmp_path / "copy"))
    assert "optimizer state is not" in capsys.readouterr().out
    back, groups = read_dcp_model(str(tmp_path / "copy"))
    assert not groups and all(torch.equal(back[k], state[k]) and torch.equal(full.state[k], state[k]) for k in state)
    with pytest.raises(CheckpointError, match="exists"):
        write_dcp_folder(str(tmp_path / "copy"), state)


class _Payload:
    def __reduce__(self):
        return (os.system, ("echo crafted > /dev/null",))


def test_crafted_metadata_is_refused(tmp_path):
    write_dcp_folder(str(tmp_path / "ckpt"), {"w": torch.zeros(2)})
    (tmp_path / "ckpt" / ".metadata").write_bytes(pickle.dumps(_Payload()))
    with pytest.raises(CheckpointError, match=r"\.metadata.*names posix\.system"):
        read_dcp_model(str(tmp_path / "ckpt"))
    with pytest.raises(CheckpointError, match="no .metadata"):
        read_dcp_model(str(tmp_path))
