"""Shared by the NxDT config tests: the vendored configs, what each needs beyond a Llama install,
and local stand-ins for the paths in them (data, tokenizer, the HF config.json they point at)."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import nxd
from nxd.catalog import provider_of
from nxd_training.config import read_yaml, resolve
from nxd_training.config.features import implemented_keys

CONF = Path(__file__).parent / "data" / "nxdt_conf"
#: configs of earlier NxDT releases (keys later releases renamed), vendored with their commit
EARLIER = Path(__file__).parent / "data" / "nxdt_conf_earlier"
#: every other distinct version in NxDT's git history (``<config>@<date>_<commit>``; test_nxdt_history.py)
HISTORY = Path(__file__).parent / "data" / "nxdt_conf_history"
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
LLAMA3_70B = {**LLAMA3_8B, "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
              "num_attention_heads": 64}
LLAMA3_405B = {**LLAMA3_8B, "hidden_size": 16384, "intermediate_size": 53248, "num_hidden_layers": 126,
               "num_attention_heads": 128}
#: Llama 3.1's config.json: the same shapes, a 128K context through "llama3" RoPE scaling
LLAMA31 = {"max_position_embeddings": 131072, "rope_scaling": {
    "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192}}
LLAMA2_7B = {**LLAMA3_8B, "vocab_size": 32000, "intermediate_size": 11008, "num_key_value_heads": 32,
             "max_position_embeddings": 4096, "rope_theta": 10000.0, "bos_token_id": 1, "eos_token_id": 2}
#: mistralai/Mistral-7B-v0.1's config.json (hf_mistral_7B_SFT_config names that folder)
MISTRAL_7B = {**LLAMA3_8B, "model_type": "mistral", "architectures": ["MistralForCausalLM"], "vocab_size": 32000,
              "max_position_embeddings": 32768, "rope_theta": 10000.0, "sliding_window": 4096, "bos_token_id": 1,
              "eos_token_id": 2}
MIXTRAL_8X7B = {"model_type": "mixtral", "architectures": ["MixtralForCausalLM"], "vocab_size": 32000,
                "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
                "num_key_value_heads": 8, "num_local_experts": 8, "num_experts_per_tok": 2,
                "max_position_embeddings": 32768, "rms_norm_eps": 1e-5, "rope_theta": 1e6, "sliding_window": None}
#: the tiny Llama the smoke runs shrink to (model.num_layers / hidden_size overridden in the YAML way)
TINY_LLAMA = {**LLAMA3_8B, "vocab_size": 512, "intermediate_size": 64, "num_attention_heads": 4,
              "num_key_value_heads": 2, "max_position_embeddings": 64, "bos_token_id": 1, "eos_token_id": 2}
TINY_MIXTRAL = {**MIXTRAL_8X7B, "vocab_size": 512, "intermediate_size": 64, "num_attention_heads": 4,
                "num_key_value_heads": 2, "max_position_embeddings": 64, "num_local_experts": 4}


def nxdt_name(stem: str) -> str:
    """The NxDT config a vendored version is of (``sdk2.20.0_megatron_gpt_config``,
    ``megatron_gpt_config@2024-10-04_cc3260b`` -> ``megatron_gpt_config``)."""
    if (EARLIER / f"{stem}.yaml").exists():
        return stem.split("_", 1)[1]
    return stem.split("@", 1)[0]


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
        self.real_json = {name: self._json(name, data) for name, data in (
            ("llama3_70b", LLAMA3_70B), ("llama3_405b", LLAMA3_405B), ("llama3.1_8b", {**LLAMA3_8B, **LLAMA31}),
            ("llama3.1_70b", {**LLAMA3_70B, **LLAMA31}), ("llama3.1_405b", {**LLAMA3_405B, **LLAMA31}),
            ("llama2_7b", LLAMA2_7B), ("mistral_7b", MISTRAL_7B))}
        self.tiny_json = self._json("tiny_llama", TINY_LLAMA)
        self.tiny_mixtral_json = self._json("tiny_mixtral", TINY_MIXTRAL)
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
        self.gpt2_vocab, self.gpt2_merges = _gpt2_bpe_files(root / "gpt2")

    def _json(self, name: str, data: dict[str, Any]) -> str:
        path = self.root / name / "config.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data))
        return str(path)

    def model_json(self, name: str, raw: dict[str, Any]) -> str:
        """The stand-in for the Hugging Face config.json the config names: the model its name and
        hidden_size say (the YAML's own keys override the file's, as in NxDT)."""
        model = raw.get("model", {})
        if "moe" in model or "mixtral" in name:
            return self.mixtral_json
        if "mistral" in name:
            return self.real_json["mistral_7b"]
        if name.startswith("hf_llama_7B"):
            return self.real_json["llama2_7b"]
        size = {8192: "70b", 16384: "405b"}.get(model.get("hidden_size"), "8b")
        version = "llama3.1" if "llama3.1" in name else "llama3"
        return self.llama_json if (version, size) == ("llama3", "8b") else self.real_json[f"{version}_{size}"]

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
            out.append(f"model.model_config={model_json or self.model_json(name, raw)}")
        if isinstance(data.get("tokenizer"), dict) and data["tokenizer"].get("type", "").startswith("/"):
            out.append(f"data.tokenizer.type={self.corpus['tokenizer']}")
        if isinstance(data.get("tokenizer"), dict) and data["tokenizer"].get("type") == "GPT2BPETokenizer":
            out += [f"data.tokenizer.vocab_file={self.gpt2_vocab}", f"data.tokenizer.merge_file={self.gpt2_merges}"]
        if "data_prefix" in data:
            out.append(f"data.data_prefix={self.corpus['data_prefix']}")
        align = raw.get("model_alignment_strategy") or data.get("alignment_strategy") or {}  # NxDT's earlier place
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


def _gpt2_bpe_files(folder: Path) -> tuple[str, str]:
    """A GPT-2-format byte-level BPE (vocab.json + merges.txt, like NxDT's gpt2-vocab.json /
    gpt2-merges.txt) of 512 entries: the vocabulary of the test corpus, so the shrunk Megatron GPT
    config trains on it."""
    from tokenizers import ByteLevelBPETokenizer

    words = [f"{a}{b}" for a in ("train", "step", "rank", "node", "save", "load", "shard", "token")
             for b in ("", "s", "ed", "ing", "er")]
    texts = [" ".join(words[(i * 7 + j) % len(words)] for j in range(12)) + f" {i}" for i in range(400)]
    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(texts, vocab_size=512, min_frequency=1, special_tokens=["<|endoftext|>"],
                            show_progress=False)
    folder.mkdir(parents=True, exist_ok=True)
    vocab, merges = tok.save_model(str(folder), "gpt2")
    assert len(json.loads(Path(vocab).read_text())) == 512
    return vocab, merges
