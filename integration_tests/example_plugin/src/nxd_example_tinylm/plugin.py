"""Entry point module: nxd imports it and calls the hooks it implements."""

from __future__ import annotations

import nxd
from nxd.specs import ModelSpec
from nxd_example_tinylm.model import TinyBlock, TinyLM, TinyLMConfig

NXD_PLUGIN_API = (1, 1)

SPEC = ModelSpec(
    name="tinylm",
    config_from_dict=lambda d: TinyLMConfig(**d),
    build=lambda config, nxd_config=None: TinyLM(config),
    transformer_layer_classes=(TinyBlock,),
    presets={"tiny": {"vocab_size": 128, "hidden_size": 32, "num_heads": 4}},
)


@nxd.hookimpl
def nxd_register_models(registry) -> None:
    registry.add("tinylm", SPEC)
