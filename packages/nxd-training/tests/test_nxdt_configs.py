"""NxD Training's published example configs (vendored unchanged in data/nxdt_conf/) as the oracle.

Every config, with only its paths pointed at local files (what a user changes to run it here),
either validates completely or is refused before launch with a reason naming the plugin or
feature that would provide what it asks for. Which one is decided by the registry, not by this
file: once a plugin that provides a requirement is installed, the same test expects the config to
validate. test_nxdt_tiny_runs.py trains every one of them, shrunk, through `nxd train`'s path.
"""

from __future__ import annotations

import pytest
import yaml
from nxdt_files import CONF, NAMES, NEEDS, Files, raw_config, reason_words, unmet

from nxd import ConfigError
from nxd_training.config import load_config, model_spec_of, read_yaml, resolve_config


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
        run = resolve_config(load_config(raw, overrides, check=False)).run
        trainer = raw["trainer"]
        assert run.derived.world_size == trainer["devices"] * trainer["num_nodes"]
        assert model_spec_of(run).name == ("gpt" if raw["model_source"] == "megatron" else "llama") or name in NEEDS
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

    config = resolve_config(load_config(raw, overrides, check=False))
    assert config.run.activation_checkpoint_config == [LlamaCoreAttention]  # resolved once, carried in the RunConfig
    config = load_config(raw, [*overrides, "model.activations_checkpoint_recompute=[LlamaMLP, ActivationMultiplyMLP]"])
    assert config.run.activation_checkpoint_config == [LlamaMLP, LlamaActivationMultiply]
    with pytest.raises(ConfigError, match=r"cannot recompute 'MixtralSparseMoeBlock'.*CoreAttention"):
        load_config(raw, [*overrides, "model.activations_checkpoint_recompute=[MixtralSparseMoeBlock]"])


# --------------------------------------------------------------------------- earlier NxDT releases
def test_earlier_keys_are_read_with_nxdts_meaning(files: Files, capsys) -> None:
    """NxDT 2.20's activations_checkpoint_recompute_mlp and the first Trn2 configs' trainer.vnc,
    in the real configs that used them: read as their newer keys, said so in the resolved notes."""
    from nxdt_files import EARLIER

    from nxd_models_llama.modeling import LlamaCoreAttention, LlamaMLP
    from nxd_training.config import dump_config

    source = EARLIER / "sdk2.20.0_hf_llama3_70B_config.yaml"
    raw = read_yaml(source)
    assert raw["model"]["activations_checkpoint_recompute_mlp"] is True  # the release's own file
    config = load_config(source, files.path_overrides("hf_llama3_70B_config", raw))
    assert config.run.activation_checkpoint_config == [LlamaCoreAttention, LlamaMLP]  # seq 8192
    assert any("activations_checkpoint_recompute_mlp=True" in n for n in config.run.derived.notes)
    written = yaml.safe_load(dump_config(config))["model"]
    assert written["activations_checkpoint_recompute"] == ["CoreAttention", "LlamaMLP"]
    assert written["activations_checkpoint_recompute_mlp"] is None
    # below NxDT's threshold (encoder_seq_length < 8192) only the core attention was recomputed
    short_raw = {**raw, "model": {**raw["model"], "encoder_seq_length": 4096}}
    short = load_config(short_raw, files.path_overrides("hf_llama3_70B_config", short_raw))
    assert short.run.activation_checkpoint_config == [LlamaCoreAttention]
    with pytest.raises(ConfigError, match="keep activations_checkpoint_recompute"):
        load_config(source, [*files.path_overrides("hf_llama3_70B_config", raw),
                             "model.activations_checkpoint_recompute=[CoreAttention]"])

    source = EARLIER / "trn2-2024-11_hf_llama3_70B_trn2_config.yaml"
    raw = read_yaml(source)
    assert raw["trainer"]["vnc"] == 2
    config = load_config(source, files.path_overrides("hf_llama3_70B_trn2_config", raw))
    assert config.trainer.lnc == 2 and config.trainer.vnc is None
    assert any(n.startswith("trainer.vnc=2") for n in config.run.derived.notes)
    from nxd.cli import main  # what a user sees: the note, then "config is valid"

    assert main(["train", str(source), *files.path_overrides("hf_llama3_70B_trn2_config", raw),
                 "model.num_layers=4", "model.hidden_size=1024", "--validate"]) == 0  # one layer per stage of its PP=4
    out = capsys.readouterr().out
    assert "nxd train: note: trainer.vnc=2 (NxD Training's earlier name) read as trainer.lnc=2" in out
    assert "config is valid" in out
    assert ("nxd train: note: exp_manager.log_parameter_norm=True: NxD Training logs the parameters' global norm every "
            "step; nxd logs the gradient norm (log_gradient_norm) but not the parameter norm, so it has no effect on "
            "this run") in out
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


def test_gpt2_bpe_tokenizer_files_size_the_vocabulary_or_are_refused(files: Files) -> None:
    """megatron_gpt_config names data.tokenizer.type=GPT2BPETokenizer with vocab_file/merge_file
    (NxDT: Megatron's GPT-2 BPE, whose vocabulary sizes the model). Absent files are refused before
    launch naming the key and the file; present ones give the model their vocabulary, the size and
    token ids transformers' GPT2Tokenizer reads from the same files."""
    from transformers import GPT2Tokenizer

    from nxd_data.tokenizers import load_tokenizer

    raw = raw_config("megatron_gpt_config")
    overrides = files.path_overrides("megatron_gpt_config", raw)
    local = [o for o in overrides if not o.startswith(("data.tokenizer.vocab_file", "data.tokenizer.merge_file"))]
    with pytest.raises(ConfigError, match=r"data.tokenizer.vocab_file: /home/ubuntu/examples_datasets/gpt2/"
                                          r"gpt2-vocab.json does not exist"):
        load_config(raw, local)
    with pytest.raises(ConfigError, match=r"data.tokenizer.merge_file: /nonexistent/merges.txt does not exist"):
        load_config(raw, [*overrides, "data.tokenizer.merge_file=/nonexistent/merges.txt"])
    run = resolve_config(load_config(raw, overrides, check=False)).run
    reference = GPT2Tokenizer(files.gpt2_vocab, files.gpt2_merges)
    assert run.derived.model["vocab_size"] == len(reference) == 512  # not GPT-2's 50257
    ours = load_tokenizer({"type": "GPT2BPETokenizer", "vocab_file": files.gpt2_vocab, "merge_file": files.gpt2_merges})
    text = "ranks trained and saved 12 shards"
    assert ours.encode(text) == reference.encode(text) and ours.eos_id == reference.eos_token_id


def test_neuron_only_keys_get_one_note_each_at_validate_time(files: Files, capsys) -> None:
    """NxDT's hf_llama3_8B_config sets the Neuron compiler/runtime keys of NxDT's schema: `nxd train
    --validate` prints one note per key set (none for the ones left off: '0', false)."""
    from nxd.cli import main
    from nxd_training.config.nxdt.history import NEURON_ONLY_KEYS

    raw = raw_config("hf_llama3_8B_config")
    assert main(["train", str(CONF / "hf_llama3_8B_config.yaml"), *files.path_overrides("hf_llama3_8B_config", raw),
                 "model.num_layers=4", "model.hidden_size=1024", "--validate"]) == 0  # one layer per stage of its PP=4
    out = capsys.readouterr().out
    noted = [line.split("note: ", 1)[1].split("=", 1)[0] for line in out.splitlines()
             if "nxd train: note: " in line and ": on Neuron, NxD Training sets" in line]
    assert noted == ["compiler_flags", "compiler_cache_url", "aync_exec_max_inflight_requests",
                     "bucket_size_collectives", "neuron_rt_exec_timeout", "model.fusions.softmax"], out
    assert set(noted) <= set(NEURON_ONLY_KEYS)
    assert ("nxd train: note: compiler_flags='--model-type transformer': on Neuron, NxD Training sets neuronx-cc's "
            "flags (NEURON_CC_FLAGS) from it; nxd does not pass it on, so it has no effect on this run") in out
    assert "config is valid" in out
    assert ("nxd train: note: exp_manager.log_parameter_norm=True: NxD Training logs the parameters' global norm every "
            "step; nxd logs the gradient norm (log_gradient_norm) but not the parameter norm, so it has no effect on "
            "this run") in out
