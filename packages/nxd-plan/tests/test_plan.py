"""The plan's numbers from the real shards: parameter totals equal the unsharded model's, the
optimizer and gradient rules of ZeRO-1, the JSON form and the fit check."""

from __future__ import annotations

import json
import math

import torch

import nxd
from nxd_plan.planner import make_run_plan


def _unsharded_numel(model_dict: dict) -> int:
    spec = nxd.get_model("llama")
    with torch.device("meta"):
        model = spec.build(spec.config_from_dict(model_dict))
    return sum(p.numel() for p in model.parameters())


def test_tiny_plan_counts_and_zero1_rules(tiny) -> None:
    plan = make_run_plan(tiny())
    hf = {"vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
          "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64}
    assert plan.parameters_total == _unsharded_numel(hf)
    assert plan.layout.world_size == 8 and len(plan.ranks) == 8
    for r in plan.ranks:
        assert r.param_bytes == 4 * r.params and r.grad_bytes == 4 * r.params  # fp32, every parameter trains
        assert r.optimizer_bytes == 2 * 4 * math.ceil(r.params / 2)  # AdamW's two fp32 states, 1/DP each
        assert r.peak_bytes == r.param_bytes + r.grad_bytes + r.optimizer_bytes + r.activation_bytes + r.transient_bytes
    # the TP ranks of one stage hold equal shards; the two stages hold 2 layers each
    assert {r.rank: sorted(i for v in r.stages.values() for i in v) for r in plan.ranks} == \
        {r: ([0, 1] if r < 4 else [2, 3]) for r in range(8)}
    # 1F1B: the first stage holds PP - 0 = 2 micro-batches in flight, the last one 1
    first, last = plan.ranks[0], plan.ranks[4]
    assert first.activation_bytes > last.activation_bytes > 0
    assert 0 < plan.bubble < 1 and plan.step_time_s > 0 and 0 < plan.mfu <= 1
    assert set(plan.comm_bytes) >= {"tp", "dp", "pp"}


def test_bf16_master_weights_add_an_fp32_shard(tiny) -> None:
    plain = make_run_plan(tiny())
    mixed = make_run_plan(tiny(precision={"type": "mixed_precision"}))
    p, m = plain.ranks[0], mixed.ranks[0]
    assert m.param_bytes * 2 == p.param_bytes  # bf16 parameters
    shard = math.ceil(m.params / 2)
    assert m.optimizer_bytes == 2 * 4 * shard + 4 * shard  # fp32 Adam states + fp32 master copy, 1/DP each


def test_json_and_device_memory(capsys, tiny) -> None:
    from nxd.cli import main

    config = tiny()
    import yaml

    path = _write(yaml.safe_dump(config))
    assert main(["plan", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["world_size"] == 8 and out["parameters_total"] > 0 and len(out["ranks"]) == 8
    assert set(out["ranks"][0]) >= {"rank", "coords", "param_bytes", "grad_bytes", "optimizer_bytes",
                                    "activation_bytes", "peak_bytes"}
    assert out["ranks"][5]["coords"] == {"tp": 1, "cp": 0, "dp": 0, "pp": 1, "ep": 0, "edp": 0}
    assert main(["plan", str(path), "--device-memory", "0.0001", "--device", "h100"]) == 0
    text = capsys.readouterr().out
    assert "8 of 8 ranks exceed 0.0 GiB" in text and "no nearby layout fits" in text


def _write(text: str):
    import tempfile
    from pathlib import Path

    path = Path(tempfile.mkdtemp()) / "plan.yaml"
    path.write_text(text)
    return path


def test_nxdt_70b_config_parameters_and_layout(nxdt_conf) -> None:
    """NxD Training's 70B config (512 ranks: TP 32 x PP 8 x DP 2) with the real Llama-3-70B shape;
    sequence shortened so the activation replica is quick (memory per token scales linearly)."""
    plan = make_run_plan(nxdt_conf / "hf_llama3_70B_config.yaml",
                         ["model.model_config=null", "+model.preset=llama3-70b", "model.encoder_seq_length=512",
                          "data.seq_length=512"])
    assert plan.parameters_total == 70_553_706_496
    assert plan.layout.world_size == 512 and (plan.layout.tp, plan.layout.pp, plan.layout.dp) == (32, 8, 2)
    assert plan.ranks[511].coords == {"tp": 31, "cp": 0, "dp": 1, "pp": 7, "ep": 0, "edp": 1}
    assert plan.device.name == "trn1"


def test_fsdp_shards_are_fully_shards_own(tiny) -> None:
    """FSDP: each rank's parameters are fully_shard's DTensor shards (built on meta parameters with a
    CPU mesh over the fake group); rows chunk over DP like torch.chunk, so with 255 embedding rows
    per TP rank over DP 4 the last DP rank holds 63; gradients and AdamW state follow the shard."""
    fsdp = make_run_plan(tiny(distributed_strategy={"pipeline_model_parallel_size": 1, "zero1": False, "fsdp": True},
                              model={"vocab_size": 510}))
    assert fsdp.layout.fsdp and fsdp.layout.dp == 4
    shard = fsdp.shards[(0, 0)]
    assert shard.fsdp == (0, 4) and shard.local == shard.stored()
    assert shard.local["model.embed_tokens.weight"] == (64, 64)
    by_dp = {r.coords["dp"]: r for r in fsdp.ranks}
    assert by_dp[3].params == by_dp[0].params - 2 * 64  # one row (64 wide) fewer of the embedding and the head
    assert sum(by_dp[i].params for i in range(4)) == shard.numel  # the DP shards make the TP rank's piece
    for r in fsdp.ranks:
        assert r.param_bytes == r.grad_bytes == 4 * r.params and r.optimizer_bytes == 2 * r.param_bytes
    assert any("fully_shard's own DTensors" in note for note in fsdp.notes)


def test_plans_the_one_resolved_config(tiny, monkeypatch) -> None:
    """``nxd plan`` reads ``nxd train``'s resolved config: given one, its sizes come from its
    resolution (the only resolution made is the activation replica's, a different config); from a
    YAML dict it resolves it once, the same way."""
    from nxd_plan.planner import resolve
    from nxd_training.config import plan as config_plan

    resolved = resolve(tiny())
    assert resolved.resolved and resolved.run.derived.dp == 2
    calls = []
    derive = config_plan.derive
    monkeypatch.setattr(config_plan, "derive", lambda *a, **k: calls.append(1) or derive(*a, **k))
    from_resolved = make_run_plan(resolved)
    assert len(calls) == 1  # the 3-layer PP=1 replica; the config itself is not resolved again
    from_dict = make_run_plan(tiny())
    assert len(calls) == 3
    assert from_resolved.as_dict() == from_dict.as_dict()
