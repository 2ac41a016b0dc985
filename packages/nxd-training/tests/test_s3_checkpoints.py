"""`exp_manager.checkpoint_callback_params.dirpath: s3://...` checkpoints into the bucket (a
loopback moto S3 server), never into a local folder named `s3:`, and resumes from it."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest


@pytest.fixture
def s3_bucket(monkeypatch):
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    for key, value in {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1",
                       "AWS_ENDPOINT_URL": f"http://{host}:{port}"}.items():
        monkeypatch.setenv(key, value)
    import s3fs

    # fsspec caches filesystems by their arguments, not the endpoint in the environment: an earlier
    # test's instance would still point at its own (stopped) server
    s3fs.S3FileSystem.clear_instance_cache()
    bucket = f"ckpts-{uuid.uuid4().hex[:8]}"
    s3fs.S3FileSystem(skip_instance_cache=True).mkdir(bucket)
    yield bucket
    server.stop()
    s3fs.S3FileSystem.clear_instance_cache()


@pytest.mark.slow
def test_train_checkpoints_to_s3_and_resumes(make_config, tmp_path: Path, s3_bucket: str, monkeypatch) -> None:
    import s3fs

    from nxd_training.config import load_config
    from nxd_training.exp_manager import read_metrics
    from nxd_training.loop import train

    monkeypatch.chdir(tmp_path)  # a local "s3:" folder would appear here
    url = f"s3://{s3_bucket}/run"
    common = {"distributed_strategy": {"tensor_model_parallel_size": 1},
              "exp_manager": {"resume_if_exists": True, "resume_ignore_no_checkpoint": True,
                              "checkpoint_callback_params": {"dirpath": url, "every_n_train_steps": 2, "save_top_k": 1}}}
    first = train(load_config(make_config(**common, trainer={"devices": 1, "max_steps": 2})))
    assert first.final_step == 2
    blocked = read_metrics(first.log_dir, split="checkpoint")  # the loop's stall per save is logged
    assert [r["step"] for r in blocked] == [2] and blocked[0]["blocked_s"] > 0
    assert not any(p.name.startswith("s3") for p in tmp_path.iterdir()), os.listdir(tmp_path)
    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    tags = [p.rsplit("/", 1)[-1] for p in fs.ls(f"{s3_bucket}/run") if fs.exists(f"{p}/done")]
    assert tags == ["tiny--step=2-consumed_samples=8"]
    second = train(load_config(make_config(**common, trainer={"devices": 1, "max_steps": 4})))
    assert second.start_step == 2 and second.final_step == 4
    assert second.resumed_from.startswith(url)
    tags = [p.rsplit("/", 1)[-1] for p in fs.ls(f"{s3_bucket}/run", refresh=True) if fs.exists(f"{p}/done")]
    assert tags == ["tiny--step=4-consumed_samples=16"]  # save_top_k=1 kept the newest in the bucket


def test_a_bucket_that_does_not_exist_is_refused_before_launch(make_config, tmp_path: Path, s3_bucket: str) -> None:
    """The battery's `nxd train` into s3://no-such-bucket trained until its first save and failed
    there; the storage now takes a probe write before any rank starts."""
    import s3fs

    from nxd import ConfigError
    from nxd_training.config import load_config
    from nxd_training.preflight import remote_checkpoints_writable

    def config(url: str):
        return load_config(make_config(exp_manager={"checkpoint_callback_params": {"dirpath": url}})).exp_manager

    with pytest.raises(ConfigError, match=r"dirpath=s3://no-such-bucket-[0-9a-f]+/run: cannot write there "
                                          r"\(.*\); check that the bucket exists"):
        remote_checkpoints_writable(config(f"s3://no-such-bucket-{uuid.uuid4().hex[:6]}/run"), tmp_path)
    remote_checkpoints_writable(config(f"s3://{s3_bucket}/run"), tmp_path)  # an existing bucket takes it
    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    assert not fs.exists(f"{s3_bucket}/run") or fs.ls(f"{s3_bucket}/run", refresh=True) == []  # probe removed
