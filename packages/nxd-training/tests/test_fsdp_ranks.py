"""FSDP2 through the YAML (``distributed_strategy.fsdp``, nxd-fsdp) on 2 real gloo ranks at DP=2: fp32
losses and clipping norms equal plain data parallelism, and the run's checkpoint exports to HF
(``nxd ckpt convert --from nxd --to hf RUN_DIR``) with the weights plain DP's run exports; with
``model.meta_device_init`` (built on the meta device, each rank materialising its shards only) the
losses are the same bit for bit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nxd_training.exp_manager import read_metrics


def _train(config: dict[str, Any], log_dir: str) -> dict[str, Any]:
    from nxd_training.config import load_config
    from nxd_training.loop import train

    result = train(load_config(config), log_dir=log_dir)
    return {"losses": result.losses}


def test_fsdp_yaml_matches_plain_dp_and_exports_to_hf(rank_pool, make_config, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    from nxd_ckpt import run_convert

    em = {"checkpoint_callback_params": {"every_n_train_steps": 4}}
    common = {"trainer": {"max_steps": 4}, "exp_manager": em}
    pool = rank_pool(2)
    plain = pool.run(_train, make_config(distributed_strategy={"tensor_model_parallel_size": 1}, **common),
                     str(tmp_path / "plain"))[0]["losses"]
    fsdp_cfg = make_config(distributed_strategy={"tensor_model_parallel_size": 1,
                                                 "fsdp": {"reshard_after_forward": True}}, **common)
    fsdp = pool.run(_train, fsdp_cfg, str(tmp_path / "fsdp"))[0]["losses"]
    # model.meta_device_init: built on meta, sharded, then each rank materialises its shards only;
    # the same initial weights, so the same computation: every loss bit for bit
    meta_cfg = make_config(distributed_strategy={"tensor_model_parallel_size": 1, "fsdp": True},
                           model={"meta_device_init": True}, trainer={"max_steps": 4})
    meta = pool.run(_train, meta_cfg, str(tmp_path / "meta"))[0]["losses"]
    assert meta == fsdp, (meta, fsdp)
    rel = max(abs(fsdp[s] - plain[s]) / abs(plain[s]) for s in plain)
    norms = [(p["grad_norm"], f["grad_norm"]) for p, f in zip(read_metrics(tmp_path / "plain"),
                                                              read_metrics(tmp_path / "fsdp"))]
    norm_rel = max(abs(a - b) / a for a, b in norms)
    print(f"YAML FSDP DP=2 vs plain DP=2 fp32: losses max rel {rel:.2e}, grad norms {norm_rel:.2e}")
    assert sorted(fsdp) == [1, 2, 3, 4] and rel < 1e-5 and norm_rel < 1e-5
    optim = {name: sorted(p.name for p in (tmp_path / name / "checkpoints").glob("*/optim/*")) for name in ("plain", "fsdp")}
    assert len(optim["plain"]) == 1 and len(optim["fsdp"]) == 2, optim  # FSDP: one optimizer shard per DP rank
    weights = {}
    for name in ("plain", "fsdp"):
        out = tmp_path / f"hf_{name}"
        run_convert("nxd", "hf", str(tmp_path / name), str(out))
        weights[name] = {k: v for f in sorted(out.glob("*.safetensors")) for k, v in load_file(f).items()}
    assert weights["fsdp"].keys() == weights["plain"].keys()
    worst = max(((weights["fsdp"][k] - v).abs().max() / v.abs().max()).item() for k, v in weights["plain"].items())
    print(f"HF export of the FSDP run vs the plain DP run: max rel {worst:.2e}")
    assert worst < 1e-5


@pytest.mark.parametrize("sections, reason", [
    ({"distributed_strategy": {"zero1": True, "fsdp": True}}, "two data-parallel strategies"),
    ({"distributed_strategy": {"fsdp": {"replicate_degree": 3}}}, "replicate_degree=3 must divide"),
    ({"distributed_strategy": {"fsdp": True}, "precision": {"type": "mixed_precision"}}, "fsdp.mixed_precision"),
])
def test_fsdp_yaml_refusals(make_config, sections: dict, reason: str) -> None:
    from nxd import ConfigError
    from nxd_training.config import load_config

    with pytest.raises(ConfigError, match=reason):
        load_config(make_config(**sections))
