"""Config validation: table-driven bad configs, overrides, interpolation, hub configs, and a
property test that random mutations never escape as anything but a clean ConfigError."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nxd import ConfigError
from nxd_training.config import hub_names, load_config, parse_config, parse_override, read_yaml, resolve, resolve_config


def test_valid_tiny_config_plans(make_config) -> None:
    run = load_config(make_config()).run
    r = run.derived
    assert (r.world_size, run.parallel.tp, run.parallel.pp, r.dp, r.num_microbatches) == (2, 2, 1, 1, 2)
    assert r.seq_length == 32 and r.data_module == "indexed"
    r = load_config(make_config(trainer={"devices": 4}, data={"global_batch_size": 8})).run.derived
    assert (r.dp, r.num_microbatches) == (2, 2)  # 8 = micro 2 x DP 2 x accumulation 2


BAD = [
    # (overrides as nested dict, words the message must contain)
    ({"trainer": {"max_stepz": 5}}, ["trainer.max_stepz", "did you mean 'max_steps'"]),
    ({"distributed_strategy": {"tensor_parallel_size": 2}}, ["distributed_strategy.tensor_parallel_size", "tensor_model_parallel_size"]),
    ({"trainer": {"devices": "two"}}, ["trainer.devices", "integer"]),
    ({"trainer": {"devices": 0}}, ["trainer.devices", "greater than or equal to 1"]),
    ({"model": {"optim": {"lr": -0.1}}}, ["model.optim.lr", "greater than 0"]),
    ({"model": {"optim": {"name": "adamww"}}}, ["model.optim.name", "did you mean 'adamw'"]),
    ({"model": {"optim": {"sched": {"name": "cosin"}}}}, ["model.optim.sched.name", "cosine"]),
    ({"precision": {"type": "bf17"}}, ["precision.type", "fp32"]),
    ({"distributed_strategy": {"tensor_model_parallel_size": 4}, "trainer": {"devices": 2}},
     ["world size 2", "tensor_model_parallel_size"]),
    ({"trainer": {"devices": 3}, "distributed_strategy": {"tensor_model_parallel_size": 1}},
     ["global_batch_size=4", "micro_batch_size x DP"]),
    ({"model": {"num_kv_heads": 3, "num_attention_heads": 6, "hidden_size": 48}, "distributed_strategy": {"tensor_model_parallel_size": 2}},
     ["num_kv_heads=3", "kv_replicator"]),
    ({"model": {"num_kv_heads": 1, "num_attention_heads": 4}, "distributed_strategy": {"tensor_model_parallel_size": 2, "kv_replicator": 1}},
     ["kv_replicator=1", "divisible"]),
    ({"model": {"num_kv_heads": 6, "num_attention_heads": 12, "hidden_size": 48},
      "distributed_strategy": {"tensor_model_parallel_size": 4, "kv_replicator": 4}, "trainer": {"devices": 4}},
     ["kv_replicator=4", "set kv_replicator: 2"]),
    ({"model": {"encoder_seq_length": 16}}, ["data.seq_length=32", "exceeds model.encoder_seq_length=16"]),
    ({"data": {"seq_length": 128}}, ["seq_length=128", "max_position_embeddings=64"]),
    ({"data": {"data_prefix": "/nonexistent/prefix"}}, ["/nonexistent/prefix"]),
    ({"data": {"module": "indexd"}}, ["data.module", "indexed"]),
    ({"model": {"architecture": "gpt5"}}, ["model.architecture", "gpt5"]),
    ({"model": {"moe": {"num_experts": 8}}}, ["model.moe", "the 'mixtral' model provides it (model.architecture: mixtral)"]),
    ({"model": {"sliding_window": 4}}, ["model.sliding_window=4", "the 'mistral' model provides it (model.architecture: mistral)"]),
    ({"model": {"activation": "gelu", "normalization": "layernorm"}},
     ["2 model features", "model.activation='gelu'", "model.normalization='layernorm'", "model.architecture: gpt"]),
    ({"model": {"activations_checkpoint_granularity": "selective", "activations_checkpoint_recompute": ["Nope"]}},
     ["activations_checkpoint_recompute", "'Nope'", "CoreAttention", "LlamaMLP"]),
    ({"model": {"model_config": {"model_type": "mixtral"}}}, ["model_type 'mixtral'", "the 'llama' model builds llama"]),
    ({"trainer": {"max_steps": -1}}, ["max_steps", "max_epochs"]),
    ({"precision": {"type": "mixed_precision"}}, ["precision.type=mixed_precision", "zero1"]),
    ({"distributed_strategy": {"context_parallel_size": 2}}, ["context_parallel_size"]),
    ({"distributed_strategy": {"context_parallel_size": 2, "tensor_model_parallel_size": 1}, "data": {"seq_length": 30}},
     ["seq_length=30", "2 x context_parallel_size = 4"]),
    ({"exp_manager": {"checkpoint_callback_params": {"filename": "{nope}"}}}, ["filename", "{step}"]),
    ({"model_alignment_strategy": {"dpo": {"kl_beta": 0.1}}}, ["model_alignment_strategy.dpo"]),
    ({"model": {"model_config": "/nonexistent/config.json"}}, ["model.model_config", "/nonexistent/config.json"]),
    # (a vocabulary not divisible by TP is padded inside the model now, so no longer refused)
    ({"model": {"fused_kernels": ["flash"]}}, ["fused_kernels", "['flash']", "rms_norm"]),
    ({"distributed_strategy": {"tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 2},
      "model_alignment_strategy": {"peft": {"lora_rank": 4}}}, ["model_alignment_strategy.peft", "pipeline"]),
    ({"model_alignment_strategy": {"peft": {"lora_rank": 4, "quantize_base": "nf4"}}},
     ["model_alignment_strategy.peft.quantize_base='nf4'", "needs model.pretrained_checkpoint"]),
    ({"model_alignment_strategy": {"peft": {"quantize_base": "int4"}}},
     ["model_alignment_strategy.peft: quantize_base must be None or one of nf4"]),
]


@pytest.mark.parametrize(("change", "words"), BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_config_names_the_key(make_config, change: dict[str, Any], words: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(make_config(**change))
    message = str(info.value)
    for word in words:
        assert word in message, f"{word!r} missing from: {message}"


def test_all_problems_reported_together(make_config) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(make_config(trainer={"devices": "x", "max_stepz": 1}, model={"optim": {"lr": 0}}))
    text = str(info.value)
    assert "3 problems" in text and "trainer.devices" in text and "trainer.max_stepz" in text and "model.optim.lr" in text


def test_valid_keys_are_listed_once_per_section(make_config) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(make_config(trainer={"max_stepz": 1, "devicez": 2, "nodes": 1}))
    text = str(info.value)
    assert "3 problems" in text and text.count("valid keys in trainer:") == 1
    assert "did you mean 'max_steps'" in text and "did you mean 'devices'" in text


def test_overrides_are_typed_by_yaml(make_config) -> None:
    assert parse_override("trainer.max_steps=50") == (["trainer", "max_steps"], 50)
    assert parse_override("model.optim.lr=1e-4") == (["model", "optim", "lr"], 1e-4)
    assert parse_override("distributed_strategy.zero1=true") == (["distributed_strategy", "zero1"], True)
    assert parse_override("model.optim.betas=[0.9, 0.95]") == (["model", "optim", "betas"], [0.9, 0.95])
    assert parse_override("+exp_manager.version=null") == (["exp_manager", "version"], None)
    config = load_config(make_config(), ["trainer.max_steps=9", "model.optim.lr=5e-3", "exp_manager.version=run1"])
    assert config.trainer.max_steps == 9 and config.model.optim.lr == 5e-3 and config.exp_manager.version == "run1"
    for bad in ("trainer.max_steps", "=3", "trainer..x=1", "trainer.max_steps=[1,"):
        with pytest.raises(ConfigError, match="override"):
            parse_override(bad)
    with pytest.raises(ConfigError, match="trainer.max_steps is a int"):
        resolve({"trainer": {"max_steps": 3}}, ["trainer.max_steps.x=1"])


def test_interpolation_is_omegaconfs(monkeypatch) -> None:
    raw = {"distributed_strategy": {"tensor_model_parallel_size": 4, "pipeline_model_parallel_size": 2},
           "model": {"encoder_seq_length": 128, "max_position_embeddings": "${.encoder_seq_length}"},
           "data": {"seq_length": "${model.encoder_seq_length}", "train_dir": "${oc.env:NXD_TEST_DATA,/default}"},
           "exp_manager": {"checkpoint_callback_params": {"model_parallel_size":
               "${multiply:${distributed_strategy.tensor_model_parallel_size}, ${distributed_strategy.pipeline_model_parallel_size}}"},
               "name": "run-${model.encoder_seq_length}"}}
    out = resolve(raw)
    assert out["data"]["seq_length"] == 128 and out["model"]["max_position_embeddings"] == 128
    assert out["exp_manager"]["checkpoint_callback_params"]["model_parallel_size"] == 8
    assert out["exp_manager"]["name"] == "run-128" and out["data"]["train_dir"] == "/default"
    monkeypatch.setenv("NXD_TEST_DATA", "/from/env")
    assert resolve(raw)["data"]["train_dir"] == "/from/env"
    # an override is merged before resolution, so interpolations see it (as with Hydra)
    assert resolve(raw, ["model.encoder_seq_length=64"])["model"]["max_position_embeddings"] == 64
    with pytest.raises(ConfigError, match=r"data.seq_length \(written '\$\{model.nope\}'\).*not found"):
        resolve({"data": {"seq_length": "${model.nope}"}})
    with pytest.raises(ConfigError, match=r"model.x.*NXD_NOT_SET"):
        resolve({"model": {"x": "${oc.env:NXD_NOT_SET}"}})
    with pytest.raises(ConfigError, match=r"model.x.*Missing mandatory value"):
        resolve({"model": {"x": "???"}})


def test_yaml_file_errors(tmp_path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer:\n  devices: [1\n")
    with pytest.raises(ConfigError, match="line"):
        load_config(bad)
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("42\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(scalar)
    with pytest.raises(ConfigError, match="did you mean 'quickstart'"):
        read_yaml("hub:quickstrat")
    dup = tmp_path / "dup.yaml"
    dup.write_text("trainer:\n  max_steps: 5\n  devices: 2\n  max_steps: 50\n")
    with pytest.raises(ConfigError, match=r"dup.yaml: found duplicate key max_steps at line 4.*line 2"):
        read_yaml(dup)
    latin = tmp_path / "latin.yaml"
    latin.write_bytes("name: caf\u00e9\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=r"latin.yaml: not UTF-8 text \(byte 0xe9 at offset 9, line 1\)"):
        load_config(latin)
    # an empty file (or only comments) is named as such, not as its first missing key (data.seq_length)
    for text in ("", "\n# nothing yet\n---\n"):
        empty = tmp_path / "empty.yaml"
        empty.write_text(text)
        with pytest.raises(ConfigError, match=r"empty.yaml: the file is empty \(no config sections\)"):
            load_config(empty)


@pytest.mark.parametrize("name", ["quickstart", "llama3.2-1b", "llama2-7b", "llama3-8b", "llama3.1-8b", "llama3-70b"])
def test_hub_configs_validate(name: str, corpus) -> None:
    assert name in hub_names()
    raw = read_yaml(f"hub:{name}")
    config = parse_config(raw)
    assert config.model.architecture == "llama"
    # Everything but the data (which lives on the cluster) must pass; point data at the test corpus.
    overrides = [f"data.data_prefix={corpus['data_prefix']}", f"data.tokenizer={corpus['tokenizer']}", "data.prepare=null"]
    if name != "quickstart":
        overrides += ["data.seq_length=64", "model.encoder_seq_length=64"]
    if config.distributed_strategy.pipeline_model_parallel_size > 1:
        import nxd

        if "1f1b" not in nxd.list_components("pipeline_schedule"):
            with pytest.raises(ConfigError, match="nxd-pipeline"):
                resolve_config(load_config(raw, overrides, check=False))
            return
    run = resolve_config(load_config(raw, overrides, check=False)).run
    r = run.derived
    assert r.world_size == config.trainer.devices * config.trainer.num_nodes
    assert run.parallel.tp * run.parallel.pp * r.dp == r.world_size


# --------------------------------------------------------------------------- property test
_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 10**6), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12), st.lists(st.integers(-3, 3), max_size=3), st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
)


def _paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    out = []
    if isinstance(node, dict):
        for key, value in node.items():
            out.append(prefix + (key,))
            out.extend(_paths(value, prefix + (key,)))
    return out


@st.composite
def mutations(draw, base: dict[str, Any]) -> dict[str, Any]:
    config = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 3))):
        paths = _paths(config)
        path = draw(st.sampled_from(paths))
        parent = config
        for part in path[:-1]:
            parent = parent[part]
        action = draw(st.sampled_from(["replace", "delete", "rename", "add"]))
        if action == "replace":
            parent[path[-1]] = draw(_VALUES)
        elif action == "delete":
            del parent[path[-1]]
        elif action == "rename":
            parent[path[-1] + draw(st.sampled_from(["_", "s", "x"]))] = parent.pop(path[-1])
        else:
            parent[draw(st.text(min_size=1, max_size=8))] = draw(_VALUES)
    return config


def test_random_mutations_give_clean_errors(make_config) -> None:
    base = make_config()

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
    @given(mutations(base))
    def check(config: dict[str, Any]) -> None:
        try:
            load_config(config)
        except ConfigError as exc:
            text = str(exc)
            assert text and "Traceback" not in text and len(text) < 5000
            assert "\n" not in text or text.startswith("invalid config")

    check()


def test_gpt_and_llama_pad_heads_and_replicate_query_groups(make_config) -> None:
    """GPT and Llama pad query heads TP does not divide (NxD's pad_model) and replicate query groups
    it does not divide (the kv_replicator NxDT names must then be that replication)."""
    gpt = {"architecture": "gpt", "num_attention_heads": 3, "num_kv_heads": 3, "hidden_size": 48}
    assert load_config(make_config(model=gpt)).run.parallel.tp == 2
    grouped = dict(gpt, num_attention_heads=6, num_kv_heads=3)
    assert load_config(make_config(model=grouped, distributed_strategy={"kv_replicator": 2})).run.parallel.tp == 2
    llama = {"num_attention_heads": 3, "num_kv_heads": 3, "hidden_size": 48}
    assert load_config(make_config(model=llama)).run.parallel.tp == 2
