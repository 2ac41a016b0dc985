"""LoraConfig: every field is checked and the error names it."""

from __future__ import annotations

import math

import pytest

from nxd.errors import ConfigError
from nxd_lora import LoraConfig


@pytest.mark.parametrize(("field", "value"), [
    ("enable_lora", "yes"),
    ("lora_rank", 0),
    ("lora_rank", 2.5),
    ("lora_rank", True),
    ("lora_alpha", -1),
    ("lora_alpha", float("nan")),
    ("lora_dropout", 1.0),
    ("lora_dropout", -0.1),
    ("bias", "some"),
    ("init_lora_weights", "pissa"),
    ("target_modules", []),
    ("target_modules", ["q_proj", 3]),
    ("target_modules", "(unclosed"),
    ("target_modules", 7),
    ("use_rslora", 1),
    ("save_lora_base", "no"),
    ("lora_save_dir", ""),
    ("lora_load_tag", 5),
    ("modules_to_save", ["lm_head"]),
])
def test_bad_field_is_named(field, value):
    with pytest.raises(ConfigError, match=field):
        LoraConfig(**{"enable_lora": True, field: value})


def test_merge_without_base_is_rejected():
    with pytest.raises(ConfigError, match="merge_lora"):
        LoraConfig(enable_lora=True, merge_lora=True)


def test_scaling_plain_and_rank_stabilised():
    assert LoraConfig(lora_rank=4, lora_alpha=8).scaling == 2.0
    assert LoraConfig(lora_rank=4, lora_alpha=8, use_rslora=True).scaling == pytest.approx(8 / math.sqrt(4))


def test_dict_round_trip_and_unknown_key():
    cfg = LoraConfig(enable_lora=True, lora_rank=3, target_modules="model\\..*q_proj")
    assert LoraConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ConfigError, match="lora_rnak"):
        LoraConfig.from_dict({"lora_rnak": 3})


def test_nxd_config_accepts_lora_config_and_rejects_junk():
    import nxd

    cfg = nxd.neuronx_distributed_config(lora_config=LoraConfig(enable_lora=True, target_modules=["q_proj"]))
    assert cfg["lora_config"].target_modules == ["q_proj"]
    with pytest.raises(ConfigError, match="lora_config"):
        nxd.neuronx_distributed_config(lora_config=42)
    with pytest.raises(ConfigError, match="pipeline_parallel_size"):
        nxd.neuronx_distributed_config(pipeline_parallel_size=2, lora_config=LoraConfig(enable_lora=True))


def test_lora_adapter_is_registered():
    import nxd

    assert "lora" in nxd.list_components("adapter")
