"""The third-party template (integration_tests/example_plugin) follows plugin-API 3: its model
family and its low-precision transform work through the core alone."""

from __future__ import annotations

import sys

import pytest
import torch

import nxd


@pytest.fixture
def example(repo_root, monkeypatch):
    monkeypatch.syspath_prepend(str(repo_root / "integration_tests" / "example_plugin" / "src"))
    monkeypatch.delitem(sys.modules, "nxd_example_tinylm.plugin", raising=False)
    from nxd_example_tinylm import plugin

    nxd.register_plugin(plugin, name="tinylm", distribution="nxd-example-tinylm")
    return plugin


def test_the_example_transform_runs_only_when_the_config_turns_it_on(example):
    spec = nxd.get_model("tinylm")
    model = spec.build({"preset": "tiny", "hidden_size": 16})  # nxd.specs.config_reader: a preset, overridden
    assert tuple(model.embed.weight.shape) == (spec.presets["tiny"]["vocab_size"], 16)
    plain = nxd.neuronx_distributed_config()
    assert nxd.transforms.apply_model_transforms(model, None, plain).head.weight.dtype == torch.float32
    config = nxd.neuronx_distributed_config(model_transforms={"tinylm_bf16": {"modules": ["head"]}})
    out = nxd.transforms.apply_model_transforms(model, None, config)
    assert out.head.weight.dtype == torch.bfloat16 and out.embed.weight.dtype == torch.float32
    assert spec.parallel_plan.modules(model, "pipeline_blocks") == [("block", model.block)]


def test_a_transform_the_config_names_must_be_installed():
    with pytest.raises(nxd.ComponentNotFound, match=r"model_transforms\['fp8'\] needs the model transform 'fp8'"):
        nxd.neuronx_distributed_config(model_transforms={"fp8": {}})
