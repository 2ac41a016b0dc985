"""NxD Training's published example configs (vendored unchanged in data/nxdt_conf/) as the oracle.

Every config, with only its paths pointed at local files (what a user changes to run it here),
either validates completely or is refused before launch with a reason naming the plugin or
feature that would provide what it asks for. Which one is decided by the registry, not by this
file: once a plugin that provides a requirement is installed, the same test expects the config to
validate. test_nxdt_tiny_runs.py trains every one of them, shrunk, through `nxd train`'s path.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from nxdt_files import CONF, NAMES, NEEDS, Files, raw_config, reason_words, unmet

from nxd import ConfigError
from nxd_training.config import load_config, make_plan, read_yaml


def test_the_vendored_configs_are_nxdts() -> None:
    assert len(NAMES) == 22
    for name in NAMES:
        head = (CONF / f"{name}.yaml").read_text().splitlines()[:3]
        assert "aws-neuron/neuronx-distributed-training" in head[0] and "Apache License" in head[2]


@pytest.mark.parametrize("name", NAMES)
def test_config_validates_or_is_refused_naming_the_provider(name: str, files: Files) -> None:
    raw = raw_config(name)
    overrides = files.path_overrides(name, raw)
    missing = unmet(name)
    if not missing:
        plan = make_plan(load_config(raw, overrides, check=False))
        trainer = raw["trainer"]
        assert plan.world_size == trainer["devices"] * trainer["num_nodes"]
        assert plan.spec.name == ("gpt" if raw["model_source"] == "megatron" else "llama") or name in NEEDS
        return
    with pytest.raises(ConfigError) as info:
        load_config(raw, overrides)
    message = str(info.value)
    assert "Traceback" not in message
    assert any(all(word in message for word in reason_words(kind, what)) for kind, what in missing), \
        f"{name}: refusal does not name any of {missing}: {message}"


def test_refusals_name_the_provider_today(files: Files) -> None:
    """The exact one-line reasons, for each requirement while it is the first one missing."""
    expected = {
        ("megatron_gpt_config", ("model", "gpt")):
            "model_source=megatron (NxD Training's Megatron GPT model) needs the model 'gpt': pip install nxd-models-gpt",
        ("hf_mixtral_8x7b_config", ("model", "mixtral")):
            "model.moe (a Mixture-of-Experts model) needs the model 'mixtral': pip install nxd-models-mixtral",
        ("hf_llama3_8B_DPO_config", ("workflow", "dpo")): "model_alignment_strategy.dpo needs the workflow 'dpo'",
        ("hf_llama3_70B_CP_config", ("feature", "distributed_strategy.context_parallel_size")):
            "distributed_strategy.context_parallel_size=2: context parallelism",
    }
    for (name, requirement), words in expected.items():
        if unmet(name)[:1] != [requirement]:
            continue
        raw = raw_config(name)
        with pytest.raises(ConfigError) as info:
            load_config(raw, files.path_overrides(name, raw))
        assert words in str(info.value), (name, str(info.value))


def test_recompute_names_map_onto_llama_modules(files: Files) -> None:
    raw = raw_config("hf_llama3_8B_config")
    overrides = files.path_overrides("hf_llama3_8B_config", raw)
    from nxd_models_llama.modeling import LlamaActivationMultiply, LlamaCoreAttention, LlamaMLP
    from nxd_training.config.features import recompute_classes

    config = load_config(raw, overrides, check=False)
    plan = make_plan(config)
    assert recompute_classes(config, plan.spec) == [LlamaCoreAttention]
    config = load_config(raw, [*overrides, "model.activations_checkpoint_recompute=[LlamaMLP, ActivationMultiplyMLP]"],
                         check=False)
    assert recompute_classes(config, plan.spec) == [LlamaMLP, LlamaActivationMultiply]
    with pytest.raises(ConfigError, match=r"cannot recompute 'MixtralSparseMoeBlock'.*CoreAttention"):
        load_config(raw, [*overrides, "model.activations_checkpoint_recompute=[MixtralSparseMoeBlock]"])


# --------------------------------------------------------------------------- earlier NxDT releases
def test_earlier_keys_are_read_with_nxdts_meaning(files: Files) -> None:
    """NxDT 2.20's activations_checkpoint_recompute_mlp and the first Trn2 configs' trainer.vnc,
    in the real configs that used them: read as their newer keys, said so in the resolved notes."""
    from nxdt_files import EARLIER

    from nxd_models_llama.modeling import LlamaCoreAttention, LlamaMLP
    from nxd_training.config import dump_config
    from nxd_training.config.features import recompute_classes

    source = EARLIER / "sdk2.20.0_hf_llama3_70B_config.yaml"
    raw = read_yaml(source)
    assert raw["model"]["activations_checkpoint_recompute_mlp"] is True  # the release's own file
    config = load_config(source, files.path_overrides("hf_llama3_70B_config", raw))
    assert recompute_classes(config, make_plan(config).spec) == [LlamaCoreAttention, LlamaMLP]  # seq 8192
    assert any("activations_checkpoint_recompute_mlp=True" in n for n in config.resolved.notes)
    written = yaml.safe_load(dump_config(config))["model"]
    assert written["activations_checkpoint_recompute"] == ["CoreAttention", "LlamaMLP"]
    assert written["activations_checkpoint_recompute_mlp"] is None
    # below NxDT's threshold (encoder_seq_length < 8192) only the core attention was recomputed
    short_raw = {**raw, "model": {**raw["model"], "encoder_seq_length": 4096}}
    short = load_config(short_raw, files.path_overrides("hf_llama3_70B_config", short_raw))
    assert recompute_classes(short, make_plan(short).spec) == [LlamaCoreAttention]
    with pytest.raises(ConfigError, match="keep activations_checkpoint_recompute"):
        load_config(source, [*files.path_overrides("hf_llama3_70B_config", raw),
                             "model.activations_checkpoint_recompute=[CoreAttention]"])

    source = EARLIER / "trn2-2024-11_hf_llama3_70B_trn2_config.yaml"
    raw = read_yaml(source)
    assert raw["trainer"]["vnc"] == 2
    config = load_config(source, files.path_overrides("hf_llama3_70B_trn2_config", raw))
    assert config.trainer.lnc == 2 and config.trainer.vnc is None
    assert any(n.startswith("trainer.vnc=2") for n in config.resolved.notes)
    with pytest.raises(ConfigError, match="keep trainer.lnc"):
        load_config(source, [*files.path_overrides("hf_llama3_70B_trn2_config", raw), "trainer.lnc=1"])


def test_earlier_key_a_model_cannot_honour_is_refused_with_the_newer_key(files: Files) -> None:
    raw = raw_config("hf_mixtral_8x7b_config")
    overrides = [*files.path_overrides("hf_mixtral_8x7b_config", raw), "model.activations_checkpoint_recompute=null",
                 "model.activations_checkpoint_granularity=selective", "model.encoder_seq_length=8192",
                 "model.activations_checkpoint_recompute_mlp=true"]
    if unmet("hf_mixtral_8x7b_config"):
        pytest.skip(f"needs {unmet('hf_mixtral_8x7b_config')}")
    with pytest.raises(ConfigError, match=r"recompute_mlp=true .*'mixtral' model has no such module.*"
                                          r"newer key model.activations_checkpoint_recompute"):
        load_config(raw, overrides)


# --------------------------------------------------------------------------- tiny runs
SHRINK = ["trainer.devices=2", "trainer.num_nodes=1", "trainer.max_steps=3", "trainer.log_every_n_steps=1",
          "trainer.enable_progress_bar=false", "trainer.accelerator=cpu",
          "distributed_strategy.tensor_model_parallel_size=2", "data.global_batch_size=2",
          "model.num_layers=2", "model.hidden_size=32", "model.encoder_seq_length=32",
          "model.max_position_embeddings=64", "exp_manager.create_tensorboard_logger=false"]


def _run(source: str, overrides: list[str], log_dir: str) -> dict[str, Any]:
    from nxd_training.config import load_config, make_plan
    from nxd_training.loop import train

    config = load_config(source, overrides)
    plan = make_plan(config)
    result = train(config, log_dir=log_dir)
    return {"losses": result.losses, "final": result.final_step, "model": plan.spec.name, "layout": (plan.tp, plan.pp)}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["hf_llama3_8B_config", "hf_llama3_8B_SFT_config", "megatron_gpt_config",
                                  "megatron_llama_7B_config", "hf_llama3_70B_CP_config",
                                  "megatron_mixtral_8x7b_config"])
def test_shrunk_config_trains_on_two_ranks(name: str, files: Files, rank_pool, tmp_path: Path) -> None:
    """NxDT's config with only paths and sizes changed trains the model it names on 2 ranks (TP=2, or
    PP=2 for the MoE configs, which ask for PP=4)."""
    raw = raw_config(name)
    # MoE configs keep pipeline parallelism (PP=2 x TP=1: the router statistics cross a stage);
    # the others run at PP=1 (2 ranks at TP=2 leave no room for PP)
    moe_pipeline = "moe" in raw["model"] and raw["distributed_strategy"].get("pipeline_model_parallel_size", 1) > 1
    missing = [need for need in unmet(name) if moe_pipeline or need[0] != "pipeline"]
    if missing:
        pytest.skip(f"needs {missing}")
    shrink = list(SHRINK)
    if "model_alignment_strategy" in raw:
        shrink.append("data.seq_length=32")
    if "model_config" not in raw["model"]:  # Megatron configs give every size in the YAML
        shrink += ["model.ffn_hidden_size=64", "model.num_attention_heads=4", "model.num_kv_heads=4"]
    if moe_pipeline:
        shrink += ["distributed_strategy.tensor_model_parallel_size=1", "distributed_strategy.pipeline_model_parallel_size=2"]
    elif raw["distributed_strategy"].get("pipeline_model_parallel_size", 1) > 1:
        shrink.append("distributed_strategy.pipeline_model_parallel_size=1")
    if raw["distributed_strategy"].get("context_parallel_size", 1) > 1:  # CP=2 over the 2 ranks, as the config asks
        shrink += ["distributed_strategy.tensor_model_parallel_size=1", "distributed_strategy.pipeline_model_parallel_size=1",
                   "distributed_strategy.sequence_parallel=false"]
    overrides = files.path_overrides(name, {**raw, "data": {**raw["data"], "seq_length": 32}}, files.tiny_json) + shrink
    results = rank_pool(2).run(_run, str(CONF / f"{name}.yaml"), overrides, str(tmp_path / "run"))
    expected = "mixtral" if "moe" in raw["model"] else "gpt" if raw["model_source"] == "megatron" else "llama"
    assert results[0]["model"] == expected
    assert results[0]["layout"] == ((1, 2) if moe_pipeline else (results[0]["layout"][0], 1))
    losses = results[0]["losses"]
    assert sorted(losses) == [1, 2, 3] and results[0]["final"] == 3
    assert results[0]["losses"] == results[1]["losses"]
    assert all(0 < loss < 20 for loss in losses.values())
