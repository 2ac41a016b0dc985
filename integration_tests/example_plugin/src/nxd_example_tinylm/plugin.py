"""Entry point module: nxd imports it and calls the hooks it implements.

It shows the three places a third party extends nxd (docs/contributing.md, "Where a new piece goes"):
a model family (``nxd_register_models``: a ModelSpec whose model is written for one device, with its
tensor-parallel plan as data that nxd applies) and a model
transform (``nxd_register_model_transforms``), here a low-precision recipe that runs at the
``low_precision`` slot when the config turns it on:
``nxd.neuronx_distributed_config(model_transforms={"tinylm_bf16": {"modules": ["head"]}})``.
"""

from __future__ import annotations

import torch

import nxd
from nxd.specs import config_reader, family_spec
from nxd.transforms import ModelTransform, When
from nxd_example_tinylm.model import TinyLM, TinyLMConfig

NXD_PLUGIN_API = (4, 4)

PRESETS = {"tiny": {"vocab_size": 128, "hidden_size": 32, "num_heads": 4}}


def _config(data: dict | TinyLMConfig) -> TinyLMConfig:
    return data if isinstance(data, TinyLMConfig) else TinyLMConfig(**data)


#: {"preset": "tiny", ...} or the config's keys (the core's helper: presets handled the same way in every family)
config_from_dict = config_reader(_config, lambda name, **overrides: {**PRESETS[name], **overrides})

#: the model class carries its family's facts (blocks, parallel plan); family_spec reads them from it and
#: builds TinyLM(config): one-device layers, sharded by the plan (parallel_plan slot)
SPEC = family_spec("tinylm", TinyLM, config_from_dict, presets=PRESETS)


def _bf16(model: torch.nn.Module, context, config) -> torch.nn.Module:
    """Keep the named submodules' parameters in bfloat16 (all of them when no ``modules`` option)."""
    names = config.transform_options("tinylm_bf16").get("modules")
    for name, module in model.named_modules():
        if name and (names is None or name in names):
            module.to(torch.bfloat16)
    return model


#: applies when the config names it in ``model_transforms`` (as data: nxd reads it without calling the plugin)
BF16 = ModelTransform("tinylm_bf16", "low_precision", _bf16, When("model_transforms", contains="tinylm_bf16"),
                      description="example low-precision recipe: bfloat16 parameters for the named modules")


@nxd.hookimpl
def nxd_register_models(registry) -> None:
    registry.add("tinylm", SPEC)


@nxd.hookimpl
def nxd_register_model_transforms(registry) -> None:
    registry.add(BF16.name, BF16)
