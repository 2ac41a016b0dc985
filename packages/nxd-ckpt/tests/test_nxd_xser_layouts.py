"""NxD's ``save_checkpoint(use_xser=True)`` files, read with torch alone: the reference file, its
``.tensors/`` folder and NxD's ``.info.pt`` (its ``_save``). With
``avoid_saving_lower_precision_weights=True`` NxD writes the model's references but no tensor files
(the weights live only as ZeRO-1 master weights): the load says so instead of failing on a pickle."""

from __future__ import annotations

import os

import pytest
import torch

from nxd_ckpt import CheckpointError
from nxd_ckpt.load import Reader
from nxd_ckpt.storage import open_storage
from nxd_ckpt.xser import save

SHARD = "dp_rank_00_tp_rank_00_pp_rank_00.pt"


def _nxd_tag(root: str, with_tensors: bool) -> None:
    path = os.path.join(root, "step", "model", SHARD)
    os.makedirs(os.path.dirname(path))
    save({"w": torch.arange(6.0).view(2, 3), "b": torch.ones(2)}, path, master_only=False)
    torch.save({0: {"shape": torch.Size([2, 3])}, 1: {"shape": torch.Size([2])}}, path + ".info.pt")
    if not with_tensors:  # NxD's ignore_tensor_data: references and info written, tensors not
        for name in os.listdir(path + ".tensors"):
            os.remove(os.path.join(path + ".tensors", name))


def test_nxd_xser_shard_reads_as_written(tmp_path):
    _nxd_tag(str(tmp_path), with_tensors=True)
    state = Reader(open_storage(str(tmp_path)), "step").load(f"model/{SHARD}")
    assert torch.equal(state["w"], torch.arange(6.0).view(2, 3)) and torch.equal(state["b"], torch.ones(2))


def test_nxd_model_saved_without_tensor_data_is_refused_by_name(tmp_path):
    _nxd_tag(str(tmp_path), with_tensors=False)
    with pytest.raises(CheckpointError, match="avoid_saving_lower_precision_weights"):
        Reader(open_storage(str(tmp_path)), "step").load(f"model/{SHARD}")
