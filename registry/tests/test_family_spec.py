"""nxd.specs.family_spec: the class carries its family's facts; a family on another's model takes the
rest from that model's spec (``base``), never its identity; nxd.dtypes: the one dtype-name table."""

from __future__ import annotations

import pytest
import torch

from nxd import ConfigError
from nxd.dtypes import dtype_name, torch_dtype
from nxd.specs import ParallelPlan, family_spec


class Block(torch.nn.Module):
    pass


class Base(torch.nn.Module):
    nxd_transformer_layer_classes = (Block,)
    nxd_parallel_plan = ParallelPlan(column=("*.up",), row=("*.down",), context_parallel=("*.attn",))

    def __init__(self, config, device=None):
        super().__init__()
        self.config = config


class Derived(Base):
    nxd_transformer_layer_classes = (torch.nn.Linear,)


def save_hf(model, out_dir):
    pass


BASE = family_spec("base", Base, dict, hf_model_types=("base",), presets={"tiny": {}},
                   lora_target_modules=("up",), save_hf=save_hf, extras={"config_class": dict, "k": 1})


def test_family_spec_inherits_base_fields_but_not_identity_or_class_facts() -> None:
    spec = family_spec("derived", Derived, lambda d: {**d, "read": True}, base=BASE, extras={"config_class": list})
    assert (spec.name, spec.hf_model_types, spec.presets) == ("derived", (), {})
    assert spec.context_parallel and spec.lora_target_modules == ("up",) and spec.save_hf is save_hf
    assert spec.transformer_layer_classes == (torch.nn.Linear,) and spec.parallel_plan is Base.nxd_parallel_plan
    assert spec.extras == {"config_class": list, "k": 1, "model_class": Derived}
    model = spec.build({"x": 1}, {"sequence_parallel": True})  # plain: the plan lays it out
    assert type(model) is Derived and model.config == {"x": 1, "read": True}


def test_family_spec_fields_override_base() -> None:
    assert family_spec("d", Derived, dict, base=BASE, lora_target_modules=("down",)).lora_target_modules == ("down",)


def test_context_parallel_is_read_from_the_plan() -> None:
    class NoAttention(Base):
        nxd_parallel_plan = ParallelPlan(column=("*.up",))

    assert BASE.context_parallel and not family_spec("n", NoAttention, dict, base=BASE).context_parallel
    with pytest.raises(TypeError, match="context_parallel"):  # one fact: the plan's, never given beside it
        family_spec("d", Derived, dict, context_parallel=True)


@pytest.mark.parametrize("given, kept", [("bf16", "bfloat16"), (torch.float32, "float32"), ("fp16", "float16"),
                                         (None, None)])
def test_dtype_name_keeps_torchs_name(given, kept) -> None:
    assert dtype_name(given, "f") == kept
    assert torch_dtype(kept) == (None if kept is None else getattr(torch, kept))


def test_dtype_name_refuses_naming_field_and_valid_names() -> None:
    with pytest.raises(ConfigError, match=r"x\.reduce must be one of fp32, float32, bf16, bfloat16 .* got 'fp16'"):
        dtype_name("fp16", "x.reduce", allowed=(torch.float32, torch.bfloat16))
