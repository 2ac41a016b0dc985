"""``nxd plugins`` prints the recipe: the registered model transforms in the order the trainer applies them."""

from __future__ import annotations

import json

from nxd.cli import main

TRANSFORMS = """
import nxd
from nxd.transforms import DATA_PARALLEL, PARALLEL_PLAN, ModelTransform, When
NXD_PLUGIN_API = (3, 3)

@nxd.hookimpl
def nxd_register_model_transforms(registry):
    registry.add("acme_ddp", ModelTransform("acme_ddp", DATA_PARALLEL, lambda m, c, k: None,
                                            When("data_parallel_strategy", equals="acme")))
    registry.add("acme_heads", ModelTransform("acme_heads", PARALLEL_PLAN + 10, lambda m, c, k: None,
                                              When("pad_model")))
    registry.add("acme_early", ModelTransform("acme_early", 5, lambda m, c, k: None))
"""


def test_plugins_prints_the_transforms_in_order_with_slot_and_condition(fake_distribution, load_only, capsys):
    load_only(fake_distribution("acme-transforms", "acme_transforms", TRANSFORMS))
    assert main(["plugins"]) == 0
    recipe = capsys.readouterr().out.split("recipe:", 1)[1].splitlines()[1:]
    assert [line.split()[:3] for line in recipe] == [
        ["5", "before", "parallel_plan"], ["110", "parallel_plan+10", "acme_heads"], ["700", "data_parallel", "acme_ddp"]]
    assert "acme-transforms" in recipe[1] and "when pad_model set" in recipe[1]
    assert "when data_parallel_strategy == 'acme'" in recipe[2] and "when always" in recipe[0]

    assert main(["plugins", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(s["order"], s["slot"], s["name"]) for s in listed["recipe"]] == [
        (5, "before parallel_plan", "acme_early"), (110, "parallel_plan+10", "acme_heads"),
        (700, "data_parallel", "acme_ddp")]
    assert any(p["distribution"] == "acme-transforms" for p in listed["plugins"])
