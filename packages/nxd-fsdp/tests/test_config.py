"""fsdp_config through neuronx_distributed_config: accepted settings, and every refusal before launch
with its reason (no ranks needed)."""

from __future__ import annotations

import pytest

import nxd
from nxd_fsdp import FsdpConfig, refusals, resolve_fsdp_config


def test_settings_resolve():
    assert resolve_fsdp_config(None) is None and resolve_fsdp_config(False) is None
    assert resolve_fsdp_config(True) == FsdpConfig()
    got = resolve_fsdp_config({"reshard_after_forward": False, "replicate_degree": 2,
                               "mixed_precision": {"param_dtype": "bf16", "reduce_dtype": "float32"}})
    assert got == FsdpConfig(False, 2, False, "bfloat16", "float32")
    cfg = nxd.neuronx_distributed_config(fsdp_config={"replicate_degree": 2})
    assert cfg["data_parallel_strategy"] == "fsdp" and cfg["fsdp_config"] == {"replicate_degree": 2}
    assert nxd.neuronx_distributed_config(data_parallel_strategy="fsdp")["fsdp_config"] is None  # defaults


@pytest.mark.parametrize("kwargs, reason", [
    (dict(fsdp_config=True, optimizer_config={"zero_one_enabled": True}), "two data-parallel strategies"),
    (dict(fsdp_config=True, data_parallel_strategy="ddp"), "set one of them only"),
    (dict(fsdp_config=True, expert_parallel_size=2, context_parallel_size=2), "context-parallel rank 0 only"),
    (dict(fsdp_config={"replicate_degree": 2}, expert_parallel_size=2), "HSDP replicas of the expert weights"),
    (dict(fsdp_config={"replicate": 2}), "unknown key 'replicate'"),
    (dict(fsdp_config={"replicate_degree": 0}), "positive integer"),
    (dict(fsdp_config={"cpu_offload": "yes"}), "true or false"),
    (dict(fsdp_config={"mixed_precision": {"param_dtype": "int8"}}), "param_dtype must be one of"),
    (dict(fsdp_config={"mixed_precision": {"compute": "bf16"}}), "unknown key 'compute'"),
    (dict(fsdp_config="on"), "True, False or a dict"),
])
def test_refused_before_launch_with_the_reason(kwargs, reason):
    with pytest.raises(nxd.ConfigError, match=reason):
        nxd.neuronx_distributed_config(**kwargs)


def test_refusals_that_need_the_ranks():
    assert refusals(FsdpConfig(replicate_degree=3), data_parallel_size=4) == [
        "fsdp_config.replicate_degree=3 must divide the data-parallel size 4 (HSDP: replicas x shards = DP)"]
    assert "accelerator" in refusals(FsdpConfig(cpu_offload=True), data_parallel_size=2, accelerator="cpu")[0]
    assert refusals(FsdpConfig(replicate_degree=2, cpu_offload=True), data_parallel_size=4, accelerator="cuda") == []
    # each alone is honoured (tests/test_context_expert_parallel.py)
    assert refusals(FsdpConfig(), data_parallel_size=2, context_parallel_size=2) == []
    assert refusals(FsdpConfig(), data_parallel_size=2, expert_parallel_size=2) == []
