"""The recipe as named slots: ``nxd plugins`` prints it; a transform declares a slot (or before/after
one), never a number; it may see the family (``spec``); a family's ``parallelize`` replaces slots;
``after_optimizer_step`` runs after each optimizer step."""

from __future__ import annotations

import json

import pytest
import torch

import nxd
from nxd.cli import main
from nxd.plugins import PluginWarning
from nxd.specs import ModelSpec, spec_of
from nxd.transforms import ModelTransform, When, apply_model_transforms, recipe_for

TRANSFORMS = """
import nxd
from nxd.transforms import ModelTransform, When, after, before
NXD_PLUGIN_API = (4, 4)

@nxd.hookimpl
def nxd_register_model_transforms(registry):
    registry.add("acme_ddp", ModelTransform("acme_ddp", "data_parallel", lambda m, c, k: None,
                                            When("data_parallel_strategy", equals="acme")))
    registry.add("acme_heads", ModelTransform("acme_heads", after("parallel_plan"), lambda m, c, k: None,
                                              When("pad_model")))
    registry.add("acme_early", ModelTransform("acme_early", before("parallel_plan"), lambda m, c, k: None))
"""


def test_plugins_prints_every_slot_with_its_transforms_and_conditions(fake_distribution, load_only, capsys):
    load_only(fake_distribution("acme-transforms", "acme_transforms", TRANSFORMS))
    assert main(["plugins"]) == 0
    recipe = capsys.readouterr().out.split("recipe:", 1)[1].splitlines()[1:]
    assert [line.split()[:2] for line in recipe] == [
        ["before:parallel_plan", "acme_early"], ["after:parallel_plan", "acme_heads"], ["expert_parallel", "-"],
        ["context_parallel", "-"], ["pad_model", "-"], ["low_precision", "-"], ["adapter", "-"],
        ["activation_checkpointing", "-"], ["compile", "-"], ["pipeline", "-"], ["data_parallel", "acme_ddp"]]
    assert "acme-transforms" in recipe[1] and "when pad_model set" in recipe[1]
    assert "when data_parallel_strategy == 'acme'" in recipe[-1] and "when always" in recipe[0]

    assert main(["plugins", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(s["slot"], s["name"]) for s in listed["recipe"]] == [
        ("before:parallel_plan", "acme_early"), ("after:parallel_plan", "acme_heads"), ("data_parallel", "acme_ddp")]
    assert listed["slots"][0] == "parallel_plan" and listed["slots"][-1] == "data_parallel"
    assert any(p["distribution"] == "acme-transforms" for p in listed["plugins"])


BAD_SLOT = """
import nxd
from nxd.transforms import ModelTransform
@nxd.hookimpl
def nxd_register_model_transforms(registry):
    registry.add("acme_quant", ModelTransform("acme_quant", "quantize", lambda m, c, k: None))
"""

ORDERED = """
import nxd
from types import SimpleNamespace
from nxd.transforms import ALWAYS
@nxd.hookimpl
def nxd_register_model_transforms(registry):
    registry.add("acme_old", SimpleNamespace(name="acme_old", order=250, applies=ALWAYS, apply=lambda m, c, k: None))
"""


@pytest.mark.parametrize(("source", "message"), [
    (BAD_SLOT, r"acme-bad's model transform 'acme_quant' declares slot 'quantize', which is not a slot of the recipe: "
               r"one of parallel_plan, expert_parallel, .*, data_parallel, or 'before:'/'after:' one of them"),
    (ORDERED, r"acme-bad's model transform 'acme_old' declares order=250: integer orders are gone since plugin-API 4; "
              r"declare slot= one of parallel_plan"),
])
def test_a_transform_outside_the_recipe_is_refused_naming_its_plugin(fake_distribution, load_only, source, message):
    load_only(fake_distribution("acme-bad", "acme_bad", source))
    with pytest.warns(PluginWarning, match=message):
        assert "acme_quant" not in nxd.list_components("model_transform")


class Tiny(torch.nn.Module):
    """A test-only family: one linear layer, no parallel plan."""

    def __init__(self, config: dict, nxd_config: dict | None = None) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(config["width"], config["width"])


def _tiny_spec(**fields) -> ModelSpec:
    return ModelSpec(name="tiny", config_from_dict=dict, build=Tiny, transformer_layer_classes=(Tiny,), **fields)


class Recorder:
    """Two transforms that write down what they saw: the family (``spec``) and where they ran."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str | None]] = []

    @nxd.hookimpl
    def nxd_register_model_transforms(self, registry):
        def plan(model, context, config, spec):
            self.calls.append(("plan", spec.name if spec else None))

        def adapter(model, context, config):
            self.calls.append(("adapter", None))

        def ddp_optimizer(config, optimizer_class, parameters, *, context, **defaults):
            return optimizer_class(parameters, **defaults)

        registry.add("plan", ModelTransform("plan", "parallel_plan", plan))
        registry.add("adapter", ModelTransform("adapter", "adapter", adapter, When("lora_config")))
        registry.add("ddp", ModelTransform("ddp", "data_parallel", lambda m, c, k: None,
                                           When("data_parallel_strategy", equals="ddp"), make_optimizer=ddp_optimizer,
                                           after_optimizer_step=self.after_step))

    def after_step(self, optimizer, context, config):
        self.calls.append(("after_optimizer_step", type(optimizer).__name__))
        return lambda: self.calls.append(("stepped", None))


def test_a_family_is_seen_by_transforms_and_its_parallelize_replaces_slots(load_only):
    load_only()  # no installed plugin: the recorder's transforms only
    recorder = Recorder()
    nxd.register_plugin(recorder, name="recorder", distribution="tests")

    # a family without parallelize: the recipe's transforms run, and see which family built the model
    plain = _tiny_spec()
    model = plain.build({"width": 2})
    assert spec_of(model) is plain and spec_of(torch.nn.Linear(1, 1)) is None
    assert apply_model_transforms(model, None, {}) is model
    assert recorder.calls == [("plan", "tiny")]

    # its own parallelize: the named slot's transforms are replaced (the replacement runs there,
    # whatever the config; it decides itself) and a slot mapped to None is skipped
    recorder.calls.clear()
    own = _tiny_spec(parallelize={"parallel_plan": lambda m, c, k: recorder.calls.append(("tiny's plan", None)),
                                  "adapter": None})
    apply_model_transforms(own.build({"width": 2}), None, {"lora_config": object()})
    assert recorder.calls == [("tiny's plan", None)]
    lines = [(s.slot, s.name, s.runs, s.why) for s in recipe_for(None, {"lora_config": object()}, own)]
    assert lines == [
        ("parallel_plan", "plan", False, "replaced by tiny's parallelize['parallel_plan']"),
        ("parallel_plan", "tiny.parallelize", True, "tiny's parallelize['parallel_plan']"),
        ("adapter", "adapter", False, "replaced by tiny's parallelize['adapter']"),
        ("adapter", "tiny.parallelize", False, "skipped by tiny's parallelize['adapter'] = None"),
        ("data_parallel", "ddp", True, "data_parallel_strategy == 'ddp'")]
    with pytest.raises(ValueError, match=r"model 'tiny': parallelize\['data_parallel'\] names no replaceable slot"):
        _tiny_spec(parallelize={"data_parallel": None})

    # the post-optimizer-step hook: made once with the optimizer, run after each of its steps
    recorder.calls.clear()
    optimizer = nxd.initialize_parallel_optimizer(nxd.neuronx_distributed_config(), torch.optim.SGD, model.parameters(), lr=0.1)
    assert recorder.calls == [("after_optimizer_step", "SGD")]
    optimizer.step()
    optimizer.step()
    assert recorder.calls[1:] == [("stepped", None)] * 2
