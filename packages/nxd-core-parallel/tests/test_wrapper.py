"""``ForwardsToModule``: the one attribute rule of nxd's model wrappers (NxDModel, NxDPPModel, LoRAModel)."""

from __future__ import annotations

import pytest
import torch

from nxd_core_parallel.wrapper import ForwardsToModule


class Wrapper(ForwardsToModule, torch.nn.Module):
    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        self.module = module


def test_a_wrapper_answers_with_its_model_attributes_and_its_own_first():
    inner = torch.nn.Linear(2, 3)
    inner.config = {"hidden": 2}
    wrapped = Wrapper(inner)
    assert wrapped.config == {"hidden": 2} and wrapped.out_features == 3  # the model's
    assert wrapped.module is inner and [n for n, _ in wrapped.named_parameters()] == ["module.weight", "module.bias"]
    with pytest.raises(AttributeError, match="no_such"):
        _ = wrapped.no_such
    with pytest.raises(AttributeError):  # before __init__ set the module: no recursion
        _ = Wrapper.__new__(Wrapper).anything
