"""NeuronLTModule's NxD argument rules: ``model_fn=None`` is fine when a subclass builds the model in
its own ``setup()`` (as NxD's tutorial modules do), and refused otherwise."""

from __future__ import annotations

import pytest
import torch

import nxd
from nxd_lightning import NeuronLTModule


class BuildsItself(NeuronLTModule):
    def setup(self, stage: str | None = None, include_buffers: bool = False) -> None:
        self.model = torch.nn.Linear(2, 2)


def test_model_fn_none_needs_an_overridden_setup():
    config = nxd.neuronx_distributed_config()
    with pytest.raises(nxd.ConfigError, match="override setup"):
        NeuronLTModule(config, torch.optim.AdamW, None, model_fn=None)
    module = BuildsItself(config, torch.optim.AdamW, None, model_fn=None)
    module.setup()
    assert isinstance(module.model, torch.nn.Linear)
