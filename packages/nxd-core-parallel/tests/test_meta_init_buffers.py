"""NxD's ``include_buffers`` under meta-device init, and NxD's ``param_init_fn(module, device)``."""

from __future__ import annotations

import torch
from torch import nn

import nxd


class WithBuffer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.register_buffer("table", torch.arange(4.0))


def _init(module: nn.Module, device: torch.device) -> None:
    if isinstance(module, nn.Linear):
        module.weight.fill_(0.5)
        module.bias.zero_()
    if isinstance(module, WithBuffer):  # only reached when its buffer was on meta (include_buffers=True)
        module.table.fill_(7.0)


def build(include_buffers: bool) -> WithBuffer:
    config = nxd.neuronx_distributed_config(model_init_config={"meta_device_init": True, "param_init_fn": _init})
    return nxd.initialize_parallel_model(config, WithBuffer, include_buffers).module


def test_buffers_keep_their_values_without_include_buffers():
    model = build(False)
    assert torch.equal(model.table, torch.arange(4.0))  # made for real, never on meta
    assert torch.equal(model.linear.weight, torch.full((4, 4), 0.5))  # param_init_fn(module, device) ran


def test_include_buffers_puts_buffers_on_meta_too():
    model = build(True)
    assert torch.equal(model.table, torch.full((4,), 7.0))  # re-initialised by param_init_fn after meta


class ScaledEmbedding(nn.Embedding):
    """A parameter and a real buffer in one module (transformers' Gemma 3 scaled embedding)."""

    def __init__(self) -> None:
        super().__init__(8, 4)
        self.register_buffer("scale", torch.tensor(2.0), persistent=False)


def test_a_real_buffer_beside_a_meta_parameter_keeps_its_value():
    config = nxd.neuronx_distributed_config(model_init_config={"meta_device_init": True, "param_init_fn": _init})
    model = nxd.initialize_parallel_model(config, ScaledEmbedding, False).module
    assert not model.weight.is_meta and float(model.scale) == 2.0  # to_empty had emptied it
