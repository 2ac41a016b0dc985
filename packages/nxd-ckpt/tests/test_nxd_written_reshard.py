"""NxD-written tags (no metadata.json) at another TP than this run's, in one process.

The TP=2 files are cut from a TP=1 model with NxD's layouts (Column rows / Row columns contiguous,
GQA K/V replicated adjacent or tiled); loading them at TP=1 must give that model back exactly, and
what nxd cannot honour (NxD's optimizer state at another PP, K/V copies in no layout NxD writes,
a tensor of no TP=2 size) is refused naming it.
"""

from __future__ import annotations

import os

import pytest
import torch

import nxd
from nxd_ckpt import CheckpointError
from nxd_ckpt.nxd_reshard import kv_rank_order

SHARD = "dp_rank_00_tp_rank_{:02d}_pp_rank_00.pt"


def _model() -> torch.nn.Module:
    from nxd_tensor_parallel.parallel_layers import ColumnParallelLinear, RowParallelLinear

    torch.manual_seed(0)
    model = torch.nn.Module()
    model.up = ColumnParallelLinear(4, 8, bias=True, gather_output=False)
    model.down = RowParallelLinear(8, 4, bias=False, input_is_parallel=True)
    return model


def _nxd_tag(root: str, full: dict[str, torch.Tensor], with_optim: bool = False) -> None:
    """``full`` as NxD writes it at TP=2: up rows and down columns split in two, no metadata."""
    os.makedirs(os.path.join(root, "t", "model"))
    for r in range(2):
        torch.save({"up.weight": full["up.weight"].chunk(2, 0)[r], "up.bias": full["up.bias"].chunk(2, 0)[r],
                    "down.weight": full["down.weight"].chunk(2, 1)[r]}, os.path.join(root, "t", "model", SHARD.format(r)))
        if with_optim:
            os.makedirs(os.path.join(root, "t", "optim"), exist_ok=True)
            torch.save({"state": {}, "param_groups": []}, os.path.join(root, "t", "optim", SHARD.format(r)))


def test_nxd_tp2_tag_loads_at_tp1_exactly(tmp_path):
    want = {k: v.clone() for k, v in _model().state_dict().items()}
    _nxd_tag(str(tmp_path), want)
    model = _model()
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    nxd.load_checkpoint(str(tmp_path), tag="t", model=model)
    assert [k for k, v in model.state_dict().items() if not torch.equal(v, want[k])] == []


def test_nxd_optimizer_state_at_another_pp_is_refused(tmp_path):
    model = _model()
    _nxd_tag(str(tmp_path), model.state_dict(), with_optim=True)
    for r in range(2):  # a second pipeline stage holding nothing of this model
        torch.save({}, os.path.join(tmp_path, "t", "model", SHARD.format(r).replace("pp_rank_00", "pp_rank_01")))
    with pytest.raises(CheckpointError, match=r"optimizer state written by NxD at TP=2 PP=2 does not reshard to this "
                                              r"run's PP=1"):
        nxd.load_checkpoint(str(tmp_path), tag="t", model=model, optimizer=torch.optim.AdamW(model.parameters()))


def test_a_tensor_of_no_tp2_size_is_refused_by_name(tmp_path):
    full = dict(_model().state_dict())
    full["up.weight"] = torch.zeros(10, 4)  # 5 rows a rank: not half of the model's 8
    _nxd_tag(str(tmp_path), full)
    with pytest.raises(CheckpointError, match=r"'up.weight'.*hold 5 rows along dim 0, which is no TP=2 share of the model's 8"):
        nxd.load_checkpoint(str(tmp_path), tag="t", model=_model())


def test_kv_replica_layouts_are_recognised_from_the_copies():
    k0, k1 = torch.zeros(2), torch.ones(2)
    # TP=4, multiplier 2: NxD on trn2 (adjacent), on trn1 / its converter (tiled), and neither
    assert kv_rank_order([k0, k0, k1, k1], 2, "x") == ([0, 1, 2, 3], "adjacent")
    assert kv_rank_order([k0, k1, k0, k1], 2, "x") == ([0, 2, 1, 3], "tiled")
    with pytest.raises(CheckpointError, match="neither on adjacent ranks"):
        kv_rank_order([k0, k1, k1, k0], 2, "x")


def test_convert_of_an_nxd_tag_says_what_describes_its_sharding(tmp_path):
    from nxd_ckpt.convert import run_convert

    _nxd_tag(str(tmp_path), _model().state_dict())
    with pytest.raises(CheckpointError, match=r"NxD does not record.*nxd.load_checkpoint\(path, tag=..., model=...\)"):
        run_convert("nxd", "full", str(tmp_path), str(tmp_path / "full.pt"), tag="t")


def test_nxd_expert_parallel_files_at_another_tp_are_refused(tmp_path):
    # NxD's per-EP-rank model files load at the EP/TP/PP they were written at only
    full = _model().state_dict()
    os.makedirs(tmp_path / "t" / "model")
    for r in range(2):
        for e in range(2):
            torch.save({"up.weight": full["up.weight"].chunk(2, 0)[r]},
                       tmp_path / "t" / "model" / f"dp_rank_00_ep_rank_{e:02d}_tp_rank_{r:02d}_pp_rank_00.pt")
    with pytest.raises(CheckpointError, match=r"per expert-parallel rank.*\(TP=2 PP=1\) only"):
        nxd.load_checkpoint(str(tmp_path), tag="t", model=_model())
