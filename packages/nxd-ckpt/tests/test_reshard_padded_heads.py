"""Attention heads padded by ``pad_model`` (3 heads at TP=2, padded to 4) are saved at their real
size and reshard: TP=2 (padded) -> TP=1 (unpadded) -> TP=2 (padded), every tensor equal to the
model built at the target TP from the saving seed, outputs equal to the unpadded model's."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

import nxd

HEADS, HEAD_DIM = 3, 4
HIDDEN = HEADS * HEAD_DIM
SAVE_SEED, OTHER_SEED = 0, 1


def _model(tp: int, seed: int) -> nn.Module:
    from nxd_core_parallel import parallel_state
    from nxd_tensor_parallel.parallel_layers import ColumnParallelLinear, RowParallelLinear
    from nxd_tensor_parallel.parallel_layers.pad import pad_model

    parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel(tp)
    torch.manual_seed(seed)
    model = nn.Sequential(ColumnParallelLinear(HIDDEN, HIDDEN, gather_output=False),
                          RowParallelLinear(HIDDEN, HIDDEN, input_is_parallel=True))
    return pad_model(model, tp, HEADS)


def padded_heads_body(path: str) -> dict:
    x = torch.randn(2, HIDDEN, generator=torch.Generator().manual_seed(5))
    model = _model(2, SAVE_SEED)
    with torch.no_grad():
        tp2_out = model(x)
    nxd.save_checkpoint(path, "tp2", model=model)
    tensors = json.loads((Path(path) / "tp2" / "metadata.json").read_text())["tensors"]
    shapes = [tensors[k]["shape"] for k in ("0.weight", "0.bias", "1.weight")]

    differ = []
    for tp, tag in ((1, "tp2"), (2, "tp1")):
        model = _model(tp, OTHER_SEED)
        nxd.load_checkpoint(path, tag, model=model)
        expected = _model(tp, SAVE_SEED).state_dict()
        differ += [f"tp{tp}:{k}" for k, v in model.state_dict().items() if not torch.equal(v, expected[k])]
        if tp == 1:
            with torch.no_grad():
                tp1_out = model(x)
            nxd.save_checkpoint(path, "tp1", model=model)
    rel = float((tp2_out - tp1_out).abs().max() / tp1_out.abs().max())
    return {"shapes": shapes, "differ": differ, "rel": rel}


def test_padded_heads_reshard_at_their_real_size(rank_pool, tmp_path):
    results = rank_pool(2).run(padded_heads_body, str(tmp_path))
    print(f"\npad_model 3 heads TP=2 -> TP=1 -> TP=2: outputs max relative difference {max(r['rel'] for r in results):.2e}")
    for r in results:
        assert r["shapes"] == [[HIDDEN, HIDDEN], [HIDDEN], [HIDDEN, HIDDEN]]  # the checkpoint holds the real heads
        assert r["differ"] == []
        assert r["rel"] <= 1e-5
