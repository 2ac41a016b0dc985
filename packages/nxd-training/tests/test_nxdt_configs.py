"""NxD Training's published example configs (vendored unchanged in data/nxdt_conf/) as the oracle.

Every config, with only its paths pointed at local files (what a user changes to run it here),
either validates completely or is refused before launch with a reason naming the plugin or
feature that would provide what it asks for. Which one is decided by the registry, not by this
file: once a plugin that provides a requirement is installed, the same test expects the config to
validate. Two of them (Llama pretraining and SFT) also train for a few steps on 2 gloo ranks with
only size overrides, the way a user shrinks a config to smoke-test it.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest

import nxd
from nxd import ConfigError
from nxd.catalog import provider_of
from nxd_training.config import load_config, make_plan, read_yaml, resolve
from nxd_training.config.features import implemented_keys

CONF = Path(__file__).parent / "data" / "nxdt_conf"
NAMES = sorted(p.name[: -len(".yaml")] for p in CONF.glob("*.yaml"))

#: What each config needs beyond a Llama install: ("model", name), ("workflow", name) components,
#: ("feature", "model:key"): a key the named model must implement (ModelSpec.implements), or
#: ("pipeline", model): the model must implement pipeline parallelism (the config asks for PP > 1).
NEEDS: dict[str, list[tuple[str, str]]] = {
    "hf_llama3_70B_CP_config": [("feature", "llama:distributed_strategy.context_parallel_size")],
    "hf_llama3_8B_DPO_config": [("workflow", "dpo")],
    "hf_llama3_8B_ORPO_config": [("workflow", "orpo")],
    "hf_mixtral_8x7b_config": [("model", "mixtral"), ("pipeline", "mixtral")],
    "hf_mixtral_8x7b_dropless_config": [("model", "mixtral"), ("pipeline", "mixtral")],
    "megatron_gpt_config": [("model", "gpt")],
    "megatron_llama2_7B_SFT_config": [("model", "gpt")],
    "megatron_llama_70b_config": [("model", "gpt")],
    "megatron_llama_7B_config": [("model", "gpt")],
    "megatron_mistral_config": [("model", "gpt")],
    "megatron_mixtral_8x7b_config": [("model", "mixtral"), ("feature", "mixtral:model.use_scaled_init_method"),
                                     ("feature", "mixtral:model.make_vocab_size_divisible_by"), ("pipeline", "mixtral")],
    "megatron_mixtral_8x7b_dropless_config": [("model", "mixtral"),
                                              ("feature", "mixtral:model.use_scaled_init_method"),
                                              ("feature", "mixtral:model.make_vocab_size_divisible_by"),
                                              ("pipeline", "mixtral")],
}

#: Real architecture facts of the HF config.json files NxDT's configs point at (model.model_config)
LLAMA3_8B = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 128256, "hidden_size": 4096,
             "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
             "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "hidden_act": "silu",
             "tie_word_embeddings": False, "bos_token_id": 128000, "eos_token_id": 128001}
MIXTRAL_8X7B = {"model_type": "mixtral", "architectures": ["MixtralForCausalLM"], "vocab_size": 32000,
                "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
                "num_key_value_heads": 8, "num_local_experts": 8, "num_experts_per_tok": 2,
                "max_position_embeddings": 32768, "rms_norm_eps": 1e-5, "rope_theta": 1e6, "sliding_window": None}
#: the tiny Llama the smoke runs shrink to (model.num_layers / hidden_size overridden in the YAML way)
TINY_LLAMA = {**LLAMA3_8B, "vocab_size": 512, "intermediate_size": 64, "num_attention_heads": 4,
              "num_key_value_heads": 2, "max_position_embeddings": 64, "bos_token_id": 1, "eos_token_id": 2}


@cache
def raw_config(name: str) -> dict[str, Any]:
    return read_yaml(CONF / f"{name}.yaml")


def unmet(name: str) -> list[tuple[str, str]]:
    """The requirements of ``name`` that this install does not provide."""
    out = []
    for kind, what in NEEDS.get(name, []):
        if kind == "feature":
            model, key = what.split(":")
            spec = nxd.get_model(model) if model in nxd.list_components("model") else None
            if spec is None or key not in implemented_keys(spec):
                out.append((kind, key))
        elif kind == "pipeline":
            spec = nxd.get_model(what) if what in nxd.list_components("model") else None
            model_class = (spec.extras or {}).get("model_class") if spec is not None else None
            if model_class is None or not hasattr(model_class, "nxd_pipeline_layout"):
                out.append((kind, what))
        elif what not in nxd.list_components(kind):
            out.append((kind, what))
    return out


def reason_words(kind: str, what: str) -> list[str]:
    """Words a refusal for this requirement must contain: the key or component, and the provider."""
    if kind == "feature":
        return [what]
    if kind == "pipeline":
        return ["pipeline_model_parallel_size", repr(what)]
    provider = provider_of(kind, what)
    return [repr(what)] + ([f"pip install {provider}"] if provider else [])


class Files:
    """Local stand-ins for the paths in NxDT's configs (their data, tokenizer, config.json)."""

    def __init__(self, root: Path, corpus: dict[str, str]) -> None:
        self.root, self.corpus = root, corpus
        self.llama_json = self._json("llama3_8b", LLAMA3_8B)
        self.mixtral_json = self._json("mixtral_8x7b", MIXTRAL_8X7B)
        self.tiny_json = self._json("tiny_llama", TINY_LLAMA)
        self.sft_jsonl = root / "sft.jsonl"
        with self.sft_jsonl.open("w") as f:  # NxD Training's SFT record fields
            for i in range(64):
                f.write(json.dumps({"input": f"Count to {i % 7}:", "output": " one two three four five six"}) + "\n")
        self.preference_jsonl = root / "preference.jsonl"
        with self.preference_jsonl.open("w") as f:  # NxD Training's DPO/ORPO record fields
            for i in range(64):
                f.write(json.dumps({"prompt": f"Count to {i % 7}:", "chosen": " one two three",
                                    "rejected": " three two one"}) + "\n")
        self._token_sets: dict[int, str] = {}

    def _json(self, name: str, data: dict[str, Any]) -> str:
        path = self.root / name / "config.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data))
        return str(path)

    def tokenized(self, seq_length: int, rows: int = 8) -> str:
        """A pre-tokenized HF dataset like NxDT's ``wikicorpus_llama3_tokenized_8k`` (rows of seq_length)."""
        if seq_length not in self._token_sets:
            import datasets
            import numpy as np

            ids = np.random.default_rng(seq_length).integers(3, 500, size=(rows, seq_length)).tolist()
            path = self.root / f"tokenized_{seq_length}"
            datasets.Dataset.from_dict({"input_ids": ids}).save_to_disk(str(path))
            self._token_sets[seq_length] = str(path)
        return self._token_sets[seq_length]

    def path_overrides(self, name: str, raw: dict[str, Any], model_json: str | None = None) -> list[str]:
        """Point every machine-specific path of the config at a local file (nothing else changes)."""
        raw = resolve(raw)
        model, data = raw.get("model", {}), raw.get("data", {})
        out = [f"exp_manager.exp_dir={self.root / 'runs' / name}"]
        if raw.get("exp_manager", {}).get("resume_from_checkpoint"):
            out.append("exp_manager.resume_from_checkpoint=null")  # their pretrained checkpoint
        if "model_config" in model:
            out.append(f"model.model_config={model_json or (self.mixtral_json if 'moe' in model else self.llama_json)}")
        if isinstance(data.get("tokenizer"), dict) and data["tokenizer"].get("type", "").startswith("/"):
            out.append(f"data.tokenizer.type={self.corpus['tokenizer']}")
        if "data_prefix" in data:
            out.append(f"data.data_prefix={self.corpus['data_prefix']}")
        align = raw.get("model_alignment_strategy") or {}
        records = self.preference_jsonl if ("dpo" in align or "orpo" in align) else self.sft_jsonl
        if "train_dir" in data:
            if align or data.get("use_sft_style_data_module"):
                out.append(f"data.train_dir={records}")
            else:
                seq = data.get("seq_length") or model.get("encoder_seq_length")
                out.append(f"data.train_dir={self.tokenized(int(seq))}")
        if data.get("val_dir"):
            out.append(f"data.val_dir={records}")
        return out


@pytest.fixture(scope="module")
def files(corpus: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Files:
    return Files(tmp_path_factory.mktemp("nxdt"), corpus)


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
