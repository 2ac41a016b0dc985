"""NxD Training's whole config family: every distinct version of every ``examples/conf`` YAML in
NxDT's git history (current, earlier releases', deleted ones), as the oracle.

data/nxdt_conf_history/ vendors each version (``<config>@<date>_<commit>``) whose keys or values
differ from the current configs (data/nxdt_conf/) and SDK 2.20's (data/nxdt_conf_earlier/); this
test resolves all three folders. With only its paths pointed at local stand-ins, every config
either resolves to the run its YAML describes (the model family, the workflow, the data module,
the world size; judged from the YAML, not from nxd's resolution) or is refused before launch
with the reason NxDT itself could not run it. Keys of earlier releases are read with the meaning
NxDT gave them and named in the resolved notes. test_nxdt_tiny_runs.py trains a sample of them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from nxdt_files import CONF, EARLIER, HISTORY, Files, nxdt_name, unmet
from test_nxdt_tiny_runs import expected_model

import nxd
from nxd import ConfigError
from nxd_training.config import load_config, read_yaml, resolve

FAMILY = sorted([*CONF.glob("*.yaml"), *EARLIER.glob("*.yaml"), *HISTORY.glob("*.yaml")], key=lambda p: p.name)

#: versions NxDT itself could not run, refused before launch for the same reason
NXDT_FAILS = {
    # NeMo's CosineAnnealing (NxDT's scheduler) raises "received an initial learning rate that was
    # lower than the minimum learning rate" at the first step; fixed in the next commit
    "hf_llama3_70B_trn2_config@2024-10-23_92bf188": r"min_lr=1e-06 is larger than model.optim.lr=5e-07",
}


def test_the_history_is_nxdts_and_distinct() -> None:
    """Each vendored version carries NxDT's attribution and differs from every other one."""
    seen: dict[str, str] = {}
    for path in FAMILY:
        text = path.read_text()
        assert "aws-neuron/neuronx-distributed-training" in text.splitlines()[0], path.name
        assert "Apache License" in text.splitlines()[2], path.name
        content = repr(read_yaml(path))
        assert content not in seen, f"{path.name} repeats {seen.get(content)}"
        seen[content] = path.name
    assert len(list(HISTORY.glob("*.yaml"))) == 63 and len(FAMILY) == 90


def expected_run(raw: dict[str, Any]) -> dict[str, Any]:
    """What NxDT runs for this (OmegaConf-resolved) YAML: its workflow and data module, from the
    alignment section wherever the release put it (model_alignment_strategy, or data.alignment_strategy
    in Oct-Dec 2024)."""
    data = raw.get("data", {})
    align = raw.get("model_alignment_strategy") or data.get("alignment_strategy") or {}
    workflow = next((k for k in align if k not in ("sft", "peft")), None)
    if workflow:
        module = "preference"
    elif "sft" in align or data.get("use_sft_style_data_module"):
        module = "sft"
    else:
        module = "indexed" if raw.get("model_source") == "megatron" else "hf"
    trainer = raw["trainer"]
    return {"workflow": workflow, "data_module": module, "world_size": trainer["devices"] * trainer["num_nodes"],
            "architecture": expected_model(raw)["family"].lower()}


@pytest.mark.parametrize("path", FAMILY, ids=[p.stem for p in FAMILY])
def test_every_version_resolves_to_the_run_it_describes(path: Path, files: Files) -> None:
    raw = read_yaml(path)
    name = nxdt_name(path.stem)
    overrides = files.path_overrides(name, raw)
    if path.stem in NXDT_FAILS:
        with pytest.raises(ConfigError, match=NXDT_FAILS[path.stem]):
            load_config(path, overrides)
        return
    if unmet(name):  # a plugin this install lacks: test_nxdt_configs checks the refusal names it
        pytest.skip(f"needs {unmet(name)}")
    config = load_config(path, overrides)
    r = config.run.derived
    # the model class NxDT would build (the 'mistral' spec's is Llama's, as NxDT's for Mistral's config.json)
    model_class = (nxd.get_model(r.architecture).extras or {})["model_class"].__name__
    got = {"workflow": r.workflow, "data_module": r.data_module, "world_size": r.world_size,
           "architecture": model_class[: -len("ForCausalLM")].lower()}
    assert got == expected_run(resolve(raw)), path.name
    data = raw.get("data", {})
    if "alignment_strategy" in data:
        assert any(n.startswith("data.alignment_strategy") for n in r.notes), r.notes
        assert "alignment_strategy" not in config.data.model_extra  # written under its later key
    if data.get("dev_choose_samples") and r.data_module in ("sft", "preference"):
        assert config.data.model_extra["dev_choose_samples"] == data["dev_choose_samples"]


def test_mistral_config_json_window_is_honoured(files: Files) -> None:
    """hf_mistral_7B_SFT_config names Mistral-7B-v0.1's config.json (model_type mistral, sliding
    window 4096). NxDT trained it with its Llama model (the window covered its 4096 tokens); nxd
    builds the ``mistral`` model (Llama's decoder with the window), so a longer sequence trains the
    same model as transformers' MistralForCausalLM too."""
    path = HISTORY / "hf_mistral_7B_SFT_config@2024-11-22_791c65d.yaml"
    raw = read_yaml(path)
    overrides = files.path_overrides("hf_mistral_7B_SFT_config", raw)
    for seq in (4096, 8192):
        config = load_config(path, [*overrides, f"data.seq_length={seq}"])
        assert config.run.derived.architecture == "mistral" and config.run.derived.model["sliding_window"] == 4096


def test_earlier_alignment_place_cannot_disagree_with_the_later_one(files: Files) -> None:
    path = HISTORY / "hf_llama3_8B_DPO_config@2024-10-23_7a0258b.yaml"
    raw = read_yaml(path)
    overrides = files.path_overrides("hf_llama3_8B_DPO_config", raw)
    config = load_config(path, overrides)
    assert config.model_alignment_strategy.dpo["max_dpo_prompt_length"] == 2048
    assert config.run.derived.workflow == "dpo" and config.run.derived.data_module == "preference"
    with pytest.raises(ConfigError, match="data.alignment_strategy .* and model_alignment_strategy are both set"):
        load_config(path, [*overrides, "+model_alignment_strategy.sft.packing=true"])
    with pytest.raises(ConfigError, match=r"max_dpo_prompt_length=2048 \(NxD Training's earlier name of "
                                          r"max_prompt_length\) and max_prompt_length=1024 disagree"):
        load_config(path, [*overrides, "+data.alignment_strategy.dpo.max_prompt_length=1024"])
