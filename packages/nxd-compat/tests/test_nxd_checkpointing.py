"""NxD's per-rank ``parallel_layers.save`` / ``load`` and ``NeuronZero1Optimizer``'s sharded
files, in NxD's layout (its ``parallel_layers/checkpointing.py`` and
``optimizer/zero_redundancy_optimizer.py``, Release 2.29), on 2 gloo ranks at TP=2.

Oracle: nxd-core-parallel's layers draw the full weight from the global RNG and keep their
shard, so one seed gives one full model at every TP size; loads must reproduce it exactly.
"""

from __future__ import annotations

import os

import pytest
import torch

SEED, OTHER = 1234, 99


def _model(tp: int, seed: int, fuse_qkv: bool = True) -> torch.nn.Module:
    from neuronx_distributed.modules.qkv_linear import GQAQKVColumnParallelLinear
    from neuronx_distributed.parallel_layers import ColumnParallelLinear, RowParallelLinear, parallel_state

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)
    torch.manual_seed(seed)
    model = torch.nn.Module()
    model.qkv = GQAQKVColumnParallelLinear(8, [8, 2], bias=False, kv_size_multiplier=tp, fuse_qkv=fuse_qkv)
    model.up = ColumnParallelLinear(8, 16, bias=True, gather_output=False)
    model.down = RowParallelLinear(16, 8, bias=True, input_is_parallel=True)
    return model


def _different(a: torch.nn.Module, b: torch.nn.Module) -> list[str]:
    sb = b.state_dict()
    return [k for k, v in a.state_dict().items() if not torch.equal(v, sb[k])]


def save_load_body(root: str, xser: bool) -> dict:
    import neuronx_distributed as nxd_api
    from neuronx_distributed.parallel_layers import checkpointing

    model = _model(2, SEED)
    nxd_api.parallel_layers.save({"model": model.state_dict(), "global_step": 7}, root, save_xser=xser,
                                 down_cast_bf16=False)
    fresh = _model(2, OTHER)
    rest = checkpointing.load(root, fresh, load_xser=xser)  # NxD's examples pass the model second
    torch.distributed.barrier()
    return {"rest": rest, "different": _different(fresh, _model(2, SEED)), "files": sorted(os.listdir(root))}


@pytest.mark.parametrize("xser", [False, True])
def test_save_load_in_nxd_layout(rank_pool, tmp_path, xser):
    out = rank_pool(2).run(save_load_body, str(tmp_path), xser)
    assert [o["rest"] for o in out] == [{"global_step": 7}] * 2
    assert [o["different"] for o in out] == [[], []]
    if xser:  # torch-xla's xser layout: a reference file and its .tensors folder per rank
        assert out[0]["files"] == ["tp_rank_00_pp_rank_00", "tp_rank_00_pp_rank_00.tensors",
                                   "tp_rank_01_pp_rank_00", "tp_rank_01_pp_rank_00.tensors"]
    else:
        assert out[0]["files"] == ["tp_rank_00_pp_rank_00", "tp_rank_01_pp_rank_00"]
        assert os.listdir(tmp_path / "tp_rank_01_pp_rank_00") == ["checkpoint.pt"]


def unsharded_body(root: str) -> dict:
    from neuronx_distributed.parallel_layers import checkpointing

    out = {}
    for fuse in (True, False):
        full = _model(1, SEED, fuse)  # the TP=1 model is the full state dict
        path = os.path.join(root, f"full{fuse}.pt")
        if torch.distributed.get_rank() == 0:
            torch.save(full.state_dict(), path)
        torch.distributed.barrier()
        fresh = _model(2, OTHER, fuse)
        assert checkpointing.load(path, model_or_optimizer=fresh, model_key=None, sharded=False) is None
        out[fuse] = _different(fresh, _model(2, SEED, fuse))
    return out


def test_full_state_dict_loads_into_a_sharded_model(rank_pool, tmp_path):
    assert rank_pool(2).run(unsharded_body, str(tmp_path)) == [{True: [], False: []}] * 2


def partial_body(root: str) -> list[str]:
    import warnings

    from neuronx_distributed.parallel_layers import checkpointing

    model = _model(2, SEED)
    state = {k: v for k, v in model.state_dict().items() if not k.startswith("down.")}
    checkpointing.save({"model": state}, root)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        checkpointing.load(root, model_or_optimizer=_model(2, OTHER), strict=False)
    return [str(w.message) for w in caught]


def test_partial_load_names_what_stays_at_init(rank_pool, tmp_path):
    (message,) = rank_pool(2).run(partial_body, str(tmp_path))[0]
    assert "initial values" in message and "'down.weight'" in message and "'down.bias'" in message


def zero1_body(root: str) -> dict:
    import neuronx_distributed as nxd_api

    config = nxd_api.neuronx_distributed_config(tensor_parallel_size=1, optimizer_config={"zero_one_enabled": True})
    torch.manual_seed(SEED)
    model = nxd_api.initialize_parallel_model(config, lambda: torch.nn.Linear(4, 4))
    opt = nxd_api.initialize_parallel_optimizer(config, torch.optim.AdamW, model.parameters(), lr=0.1)
    model(torch.ones(2, 4)).sum().backward()
    opt.step()
    opt.save_sharded_state_dict(root)
    torch.distributed.barrier()
    files = sorted(os.listdir(root))
    saved = torch.load(os.path.join(root, files[torch.distributed.get_rank()]), weights_only=True)
    opt2 = nxd_api.initialize_parallel_optimizer(config, torch.optim.AdamW, model.parameters(), lr=0.1)
    opt2.load_sharded_state_dict(root)
    a, b = opt.state_dict(), opt2.state_dict()
    same = all(torch.equal(x, b["state"][i][k]) for i, s in a["state"].items() for k, x in s.items()
               if torch.is_tensor(x))
    return {"files": files, "ranks": (saved["dp_rank"], saved["tp_rank"]), "same": same}


def test_zero1_sharded_files_have_nxd_names(rank_pool, tmp_path):
    out = rank_pool(2).run(zero1_body, str(tmp_path))
    assert out[0]["files"] == ["optim.dp_rank_00.tp_rank_00", "optim.dp_rank_01.tp_rank_00"]
    assert [o["ranks"] for o in out] == [(0, 0), (1, 0)] and all(o["same"] for o in out)
