"""DCP folders in one process (nxd_ckpt.dcp_folder, ``nxd ckpt convert --from/--to dcp``): a folder in
torchtitan's/nxd-fsdp's layout (model at the top level, the optimizer under ``optimizer``) converts
its model bit-exact and names what it leaves; a ``.metadata`` pickle naming anything but DCP's own
classes is refused before anything in it runs."""

from __future__ import annotations

import os
import pickle
import shutil

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


class _Marker:
    """Unpickled by a reader that runs code: creates the file ``path``."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def test_nxd_written_dcp_is_read_without_running_code(tmp_path, capfd):
    """``nxd_dcp.read_dcp`` (NxD's DCP optimizer layout, ``use_zero1_dcp``): plain entries load; a
    ``.metadata`` or a non-tensor entry that would run code is refused naming the file, nothing runs,
    and stderr holds no torch "Global metadata is not found" traceback and no ``weights_only`` advice."""
    from nxd_ckpt.nxd_dcp import read_dcp
    from nxd_ckpt.storage import LocalStorage

    storage = LocalStorage(str(tmp_path))
    saved = {"w": torch.arange(4.0), "param_groups": [{"lr": 0.1, "params": [0]}]}
    dcp.save(saved, checkpoint_id=str(tmp_path / "ok"), no_dist=True)
    back = read_dcp(storage, "ok")
    assert torch.equal(back["w"], saved["w"]) and back["param_groups"] == saved["param_groups"]

    ran = tmp_path / "ran"
    dcp.save({"w": torch.zeros(2), "extra": _Marker(str(ran))}, checkpoint_id=str(tmp_path / "entry"), no_dist=True)
    with pytest.raises(CheckpointError, match=r"entry 'extra' is not plain data .*refusing to unpickle it"):
        read_dcp(storage, "entry")
    shutil.copytree(tmp_path / "ok", tmp_path / "meta")
    (tmp_path / "meta" / ".metadata").write_bytes(pickle.dumps(_Marker(str(ran))))
    capfd.readouterr()
    with pytest.raises(CheckpointError) as caught:
        read_dcp(storage, "meta")
    assert f"{tmp_path / 'meta' / '.metadata'}: not a DCP metadata file" in str(caught.value), caught.value
    assert "names posix.system" in str(caught.value)
    err = capfd.readouterr().err
    assert not ran.exists()
    assert "Global metadata" not in err and "Traceback" not in err and "weights_only" not in err, err
