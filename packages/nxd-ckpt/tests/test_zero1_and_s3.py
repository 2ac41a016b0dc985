"""ZeRO-1 optimizer shards across DP sizes (duck-typed contract) and S3 storage (moto server)."""

from __future__ import annotations

import uuid

import pytest
import torch
import torch.distributed as dist
from ckpt_helpers import ShardedMomentum, TinyNet

import nxd
from nxd_ckpt import CheckpointError

NUMEL = 11
FULL = torch.arange(NUMEL, dtype=torch.float32) * 0.5


def zero1_save_body(path: str) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    opt = ShardedMomentum(NUMEL, rank, world)
    opt.momentum = FULL[opt.start:opt.end].clone()
    nxd.save_checkpoint(path, "z", optimizer=opt)


def zero1_load_body(path: str) -> list[float]:
    rank, world = dist.get_rank(), dist.get_world_size()
    opt = ShardedMomentum(NUMEL, rank, world)
    nxd.load_checkpoint(path, "z", optimizer=opt)
    return opt.momentum.tolist()


def test_zero1_shards_reshard_across_dp(rank_pool, tmp_path):
    pool = rank_pool(2)
    pool.run(zero1_save_body, str(tmp_path / "dp2"))
    assert sorted(p.name for p in (tmp_path / "dp2" / "z" / "optim").iterdir()) == [
        "dp_rank_00_tp_rank_00_pp_rank_00.pt", "dp_rank_01_tp_rank_00_pp_rank_00.pt"]
    # DP=2 -> DP=1 (this process) and DP=2 -> DP=2
    opt = ShardedMomentum(NUMEL, 0, 1)
    nxd.load_checkpoint(str(tmp_path / "dp2"), "z", optimizer=opt)
    assert torch.equal(opt.momentum, FULL)
    assert pool.run(zero1_load_body, str(tmp_path / "dp2")) == [FULL[:6].tolist(), FULL[6:].tolist()]
    # DP=1 -> DP=2
    single = ShardedMomentum(NUMEL, 0, 1)
    single.momentum = FULL.clone()
    nxd.save_checkpoint(str(tmp_path / "dp1"), "z", optimizer=single)
    assert pool.run(zero1_load_body, str(tmp_path / "dp1")) == [FULL[:6].tolist(), FULL[6:].tolist()]


def test_zero1_checkpoint_refuses_plain_optimizer(tmp_path):
    single = ShardedMomentum(NUMEL, 0, 1)
    nxd.save_checkpoint(str(tmp_path), "z", optimizer=single)
    plain = torch.optim.SGD(TinyNet().parameters(), lr=0.1)
    with pytest.raises(CheckpointError, match="ZeRO-1"):
        nxd.load_checkpoint(str(tmp_path), "z", optimizer=plain)


@pytest.fixture
def s3(monkeypatch):
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    for key, value in {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
                       "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(key, value)
    import s3fs

    options = {"client_kwargs": {"endpoint_url": endpoint}, "skip_instance_cache": True}
    bucket = f"ckpts-{uuid.uuid4().hex[:8]}"  # moto's backend outlives one server
    s3fs.S3FileSystem(**options).mkdir(bucket)
    yield options, bucket
    server.stop()


def test_s3_save_load_retention_and_resume(s3):
    options, bucket = s3
    torch.manual_seed(0)
    model = TinyNet()
    opt = torch.optim.AdamW(model.parameters())
    for step in (1, 2, 3):
        nxd.save_checkpoint(f"s3://{bucket}/run", f"step_{step}", model=model, optimizer=opt, user_content={"step": step},
                            num_kept_ckpts=2, async_save=step == 3, storage_options=options)
    nxd.finalize_checkpoint()
    import s3fs

    fs = s3fs.S3FileSystem(**options)
    assert sorted(p.rsplit("/", 1)[-1] for p in fs.ls(f"{bucket}/run")) == ["newest", "step_2", "step_3"]
    assert fs.exists(f"{bucket}/run/step_3/model/dp_rank_00_tp_rank_00_pp_rank_00.pt")
    loaded = TinyNet()
    assert nxd.load_checkpoint(f"s3://{bucket}/run", model=loaded, storage_options=options) == {"step": 3}
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), loaded.state_dict().values()))
    assert nxd.get_checkpointer().has_checkpoint(f"s3://{bucket}/run", storage_options=options)


def test_s3_errors_never_delete_last_good(s3):
    options, bucket = s3
    model = TinyNet()
    nxd.save_checkpoint(f"s3://{bucket}/run", "good", model=model, user_content="good", storage_options=options)
    # a bucket that does not exist: every write fails with an S3 error
    with pytest.raises(CheckpointError, match="not saved"):
        nxd.save_checkpoint("s3://no-such-bucket/run", "bad", model=model, num_kept_ckpts=1, storage_options=options)
    assert nxd.load_checkpoint(f"s3://{bucket}/run", model=TinyNet(), storage_options=options) == "good"


def test_s3_timeout_and_retries_are_configurable(s3):
    """An unreachable endpoint fails the save; with retries=1 and a short timeout it says so fast."""
    import socket
    import time

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    options = {"client_kwargs": {"endpoint_url": dead}, "skip_instance_cache": True, "timeout": 1, "retries": 1}
    start = time.monotonic()
    with pytest.raises(CheckpointError, match="not saved"):
        nxd.save_checkpoint("s3://bucket/run", "a", model=TinyNet(), storage_options=options)
    assert time.monotonic() - start < 15
