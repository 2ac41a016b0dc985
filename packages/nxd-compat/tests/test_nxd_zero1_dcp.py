"""NxD's ZeRO-1 optimizer state written with torch.distributed.checkpoint loads into nxd-zero1.

NxD's ``save_checkpoint(async_save=True, use_zero1_dcp=True)`` hands ``<tag>/optim`` to
``optimizer/zero_dcp_utils.save_optim_state_dict`` (vendored unchanged): each DP rank's torch-xla
ZeRO-1 shard becomes a DCP ``ShardedTensor`` per state tensor, keyed by parameter name (plus
``|tp-NNNN`` / ``|pp-NNNN`` at TP/PP > 1). Here NxD's function writes it from the shards torch-xla's
rules make of a plain AdamW's state (pad dim 0 to a multiple of DP, rank r keeps chunk r) on 2
gloo ranks; ``nxd.load_checkpoint`` of the tag (NxD's model file beside it, no ``done``) must give
the DP=2 nxd-zero1 optimizer that state exactly, i.e. NxD's own shards back from ``xla_state_dict``.
"""

from __future__ import annotations

import copy
import os

import pytest
import torch
import torch.nn.functional as F

KEYS = ("exp_avg", "exp_avg_sq")
LR = 2e-2


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    # dim 0 divisible by DP=2: NxD's _tensor_to_sharded_tensor computes the other ranks' chunk sizes
    # from the last rank's unpadded chunk, so NxD's DCP save fails on a padded parameter (7 rows: 5 of 7 covered)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 4))


def _xla_chunk(full: torch.Tensor, dp: int, rank: int) -> torch.Tensor:
    """torch-xla's ``_pad_to_world_size`` + ``_shard_tensor``."""
    if full.size(0) % dp:
        full = F.pad(full, [0, 0] * (full.dim() - 1) + [0, dp - full.size(0) % dp])
    return full.chunk(dp)[rank].clone()


def _nxd_shards(dp: int) -> tuple[dict, list[dict]]:
    """The model state and every DP rank's ``NeuronZero1Optimizer.state_dict()`` after 3 AdamW steps."""
    model = _model(0)
    plain = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.1)
    for step in range(3):
        x = torch.randn(8, 6, generator=torch.Generator().manual_seed(step))
        plain.zero_grad()
        F.mse_loss(model(x), x[:, :4]).backward()
        plain.step()
    params = list(model.parameters())
    groups = [{"lr": LR, "weight_decay": 0.1, "params": list(range(len(params)))}]
    shards = [{"state": {}, "param_groups": copy.deepcopy(groups), "shape_info": {i: p.shape for i, p in enumerate(params)},
               "base_state": {i: {k: (_xla_chunk(v, dp, r) if k in KEYS else v.clone()) for k, v in plain.state[p].items()}
                              for i, p in enumerate(params)}} for r in range(dp)]
    return {k: v.clone() for k, v in model.state_dict().items()}, shards


def nxd_dcp_save_body(root: str, model_state: dict, shards: list[dict]) -> list[str]:
    import torch.distributed as dist

    from neuronx_distributed.optimizer import zero_dcp_utils
    from neuronx_distributed.parallel_layers import parallel_state

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=1)
    model = _model(0)
    rank = dist.get_rank()
    # NxD's get_dcp_aux_infos(model, optimizer), from the optimizer's params and its state_dict's shape_info
    names = {i: n for i, (n, _) in enumerate(model.named_parameters())}
    aux = {"optim_pid_to_params": dict(enumerate(model.parameters())), "optim_pid_to_pnames": names,
           "shape_info": shards[rank]["shape_info"]}
    os.makedirs(os.path.join(root, "tag", "optim"), exist_ok=True)
    zero_dcp_utils.save_optim_state_dict(os.path.join(root, "tag", "optim"), shards[rank], aux)
    if rank == 0:  # NxD's model file of the tag (save_checkpoint's _save, torch format)
        os.makedirs(os.path.join(root, "tag", "model"), exist_ok=True)
        torch.save(model_state, os.path.join(root, "tag", "model", "dp_rank_00_tp_rank_00_pp_rank_00.pt"))
    dist.barrier()
    return sorted(os.listdir(os.path.join(root, "tag", "optim")))


def nxd_dcp_load_body(root: str) -> dict:
    import nxd
    from nxd_zero1.xla_layout import xla_state_dict

    cfg = nxd.neuronx_distributed_config(optimizer_config={"zero_one_enabled": True, "grad_clipping": False})
    from nxd_ckpt import CheckpointError

    model = _model(1)  # other weights: the load must replace them
    opt = nxd.initialize_parallel_optimizer(cfg, torch.optim.AdamW, model.parameters(), lr=LR, weight_decay=0.1)
    try:  # the state is keyed by parameter name: without the model nothing names the optimizer's parameters
        nxd.load_checkpoint(root, tag="tag", optimizer=opt)
        refusal = ""
    except CheckpointError as err:
        refusal = str(err)
    nxd.load_checkpoint(root, tag="tag", model=model, optimizer=opt, use_zero1_dcp=True)
    return {"xla": xla_state_dict(opt), "model": {k: v.clone() for k, v in model.state_dict().items()},
            "refusal": refusal}


def test_nxd_zero1_dcp_checkpoint_loads(rank_pool, tmp_path):
    model_state, shards = _nxd_shards(dp=2)
    files = rank_pool(2).run(nxd_dcp_save_body, str(tmp_path), model_state, shards)[0]
    assert ".metadata" in files and any(f.endswith(".distcp") for f in files), files
    assert "nxd_checksums.json" in files, files  # NxD's writer, through nxd's DCP integrity
    out = rank_pool(2).run(nxd_dcp_load_body, str(tmp_path))
    for r, got in enumerate(out):
        assert "keyed by parameter name: pass the model too" in got["refusal"], got["refusal"]
        assert all(torch.equal(got["model"][k], v) for k, v in model_state.items())
        for i, want in shards[r]["base_state"].items():
            for k in KEYS:
                assert torch.equal(got["xla"]["base_state"][i][k], want[k]), (r, i, k)
            assert float(got["xla"]["base_state"][i]["step"]) == float(want["step"])
    # NxD's own reader of that folder: verified as it reads, a flipped byte named, no manifest noted
    back = rank_pool(2).run(nxd_dcp_verified_load_body, str(tmp_path), shards)
    for r, got in enumerate(back):
        state, notes = got["intact"]
        assert isinstance(state, dict) and not notes, (state, notes)
        for i, want in shards[r]["base_state"].items():
            assert all(torch.equal(state["base_state"][i][k], want[k]) for k in KEYS), (r, i)
        error, _ = got["flipped"]
        assert f"{got['shard']}: content checksum mismatch" in error and "weights_only" not in error, error
        state, notes = got["unverified"]
        assert isinstance(state, dict), state
        assert len(notes) == (r == 0) and all("no nxd_checksums.json" in n and "unverified" in n for n in notes), notes


class _Captures:  # stands in for NxD's ZeRO-1 optimizer: load_optim_state_dict hands it the state it read
    def load_state_dict(self, state: dict) -> None:
        self.state = state


def nxd_dcp_verified_load_body(root: str, shards: list[dict]) -> dict:
    """NxD's own ``load_optim_state_dict`` of the folder NxD's ``save_optim_state_dict`` wrote: intact,
    with one flipped byte in a ``.distcp``, and (byte restored) without nxd's manifest."""
    import shutil
    import warnings

    import torch.distributed as dist

    from neuronx_distributed.optimizer import zero_dcp_utils
    from neuronx_distributed.parallel_layers import parallel_state

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=1)
    rank, path = dist.get_rank(), os.path.join(root, "tag", "optim")
    model = _model(0)
    aux = {"optim_pid_to_params": dict(enumerate(model.parameters())), "shape_info": shards[rank]["shape_info"],
           "optim_pid_to_pnames": {i: n for i, (n, _) in enumerate(model.named_parameters())}}

    def load() -> tuple[dict | str, list[str]]:
        opt = _Captures()
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            try:
                zero_dcp_utils.load_optim_state_dict(path, opt, aux)
                got: dict | str = opt.state
            except Exception as exc:  # noqa: BLE001 - the test reads the message
                got = f"{type(exc).__name__}: {exc}"
        dist.barrier()
        return got, [str(w.message) for w in seen if "unverified" in str(w.message)]

    out = {"intact": load()}
    shard = os.path.join(path, sorted(f for f in os.listdir(path) if f.endswith(".distcp"))[0])
    if rank == 0:
        shutil.copy(shard, root + "/good")
        with open(shard, "r+b") as f:  # one byte in the middle of the file (a tensor's bytes)
            f.seek(os.path.getsize(shard) // 2)
            byte = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte[0] ^ 0x10]))
    dist.barrier()
    out["flipped"], out["shard"] = load(), shard
    if rank == 0:
        os.replace(root + "/good", shard)
        os.rename(os.path.join(path, "nxd_checksums.json"), root + "/manifest")
    dist.barrier()
    out["unverified"] = load()
    return out


def _zero1_model(tp: int, seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    import nxd
    from nxd_core_parallel import parallel_state
    from nxd_tensor_parallel.parallel_layers import ColumnParallelLinear, RowParallelLinear

    parallel_state.destroy_model_parallel()
    cfg = nxd.neuronx_distributed_config(tensor_parallel_size=tp,
                                         optimizer_config={"zero_one_enabled": True, "grad_clipping": False})
    torch.manual_seed(seed)
    model = torch.nn.Sequential(ColumnParallelLinear(6, 8, gather_output=False),
                                RowParallelLinear(8, 4, input_is_parallel=True))
    return model, nxd.initialize_parallel_optimizer(cfg, torch.optim.AdamW, model.parameters(), lr=LR, weight_decay=0.1)


def nxd_writes_dcp_body(root: str, tp: int) -> dict:
    import nxd
    from neuronx_distributed.optimizer import zero_dcp_utils
    from neuronx_distributed.trainer import save_checkpoint

    model, opt = _zero1_model(tp, seed=0)
    for step in range(2):
        x = torch.randn(8, 6, generator=torch.Generator().manual_seed(step))
        opt.zero_grad()
        F.mse_loss(model(x), x[:, :4]).backward()
        opt.step()
    # NxD writes DCP from its async saves only; nxd from both (the TP=2 case saves synchronously)
    save_checkpoint(root, "t", model=model, optimizer=opt, use_zero1_dcp=True, async_save=tp == 1)
    nxd.finalize_checkpoint()
    # NxD's own writer of the same state: torch-xla's state_dict() of this DP rank (no dp_rank/tp_rank
    # keys) with what NxD's get_dcp_aux_infos(model, optimizer) gives it
    xla = {k: v for k, v in opt.xla_state_dict().items() if k not in ("dp_rank", "tp_rank")}
    aux = {"optim_pid_to_params": dict(enumerate(model.parameters())), "shape_info": xla["shape_info"],
           "optim_pid_to_pnames": {i: n for i, (n, _) in enumerate(model.named_parameters())}}
    if tp == 1:  # at TP>1 NxD's writer fails here: its ShardedTensor names DP rank r as global rank r
        os.makedirs(os.path.join(root, "nxd_wrote"), exist_ok=True)
        zero_dcp_utils.save_optim_state_dict(os.path.join(root, "nxd_wrote"), xla, aux)
    out = {"whole": opt.xla_state_dict(whole=True), "files": sorted(os.listdir(os.path.join(root, "t", "optim")))}
    for load_tp in (tp, 1):  # nxd reads it back, at this TP and at TP=1 (resharded)
        model, opt = _zero1_model(load_tp, seed=1)
        nxd.load_checkpoint(root, tag="t", model=model, optimizer=opt)
        out[f"back_tp{load_tp}"] = opt.xla_state_dict(whole=True)
    return out


@pytest.mark.parametrize("tp", [1, 2])
def test_use_zero1_dcp_writes_nxd_layout(rank_pool, tmp_path, tp):
    out = rank_pool(2).run(nxd_writes_dcp_body, str(tmp_path), tp)
    from torch.distributed.checkpoint import FileSystemReader

    assert ".metadata" in out[0]["files"] and any(f.endswith(".distcp") for f in out[0]["files"]), out[0]["files"]
    ours = FileSystemReader(str(tmp_path / "t" / "optim")).read_metadata()
    names = ["0.weight", "0.bias", "1.weight", "1.bias"]
    suffixes = [""] if tp == 1 else [f"|tp-{r:04d}" for r in range(tp)]  # NxD's _wrap_optim_state_dict keys
    assert {f"base_state.{n}.{k}{s}" for n in names for k in KEYS for s in suffixes} | \
        {f"base_state.{n}.step" for n in names} <= set(ours.state_dict_metadata)
    if tp == 1:  # the keys, global shapes and dtypes NxD's own writer gives the same state, the same values
        nxds = FileSystemReader(str(tmp_path / "nxd_wrote")).read_metadata()
        assert ours.planner_data == nxds.planner_data
        assert {k: (getattr(v, "size", None), getattr(getattr(v, "properties", None), "dtype", None))
                for k, v in ours.state_dict_metadata.items()} == \
            {k: (getattr(v, "size", None), getattr(getattr(v, "properties", None), "dtype", None))
             for k, v in nxds.state_dict_metadata.items()}
        a, b = (_dcp_content(d) for d in (tmp_path / "t" / "optim", tmp_path / "nxd_wrote"))
        assert _equal(a, b), "nxd's and NxD's DCP files hold different values"
    for r in out:
        assert all(torch.equal(r[f"back_tp{tp}"]["base_state"][i][k], w[k])
                   for i, w in r["whole"]["base_state"].items() for k in KEYS)
    # at TP=1 every moment is the TP ranks' pieces joined along its parameter's partition dim (rows of the
    # column layer, columns of the row layer's weight; the row layer's bias is whole on each rank)
    dims = {0: 0, 1: 0, 2: 1, 3: None}
    for i, dim in dims.items():
        for k in KEYS:
            pieces = [r["whole"]["base_state"][i][k] for r in out[:tp]]
            full = pieces[0] if dim is None else torch.cat(pieces, dim)
            assert torch.equal(out[0]["back_tp1"]["base_state"][i][k], full), (i, k)


def _dcp_content(path) -> dict:
    import io

    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    buffer = io.BytesIO()
    dcp_to_torch_save(str(path), buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def _equal(a, b) -> bool:
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    if torch.is_tensor(a):
        return torch.is_tensor(b) and a.dtype == b.dtype and torch.equal(a, b)
    return a == b
