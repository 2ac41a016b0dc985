"""The parallel plans (data on the specs) name exactly the parallel layers they make of the plain builds."""

from __future__ import annotations

import pytest

import nxd
from nxd_moe.experts import ExpertMLPs
from nxd_tensor_parallel.parallel_plan import plan_mismatches


@pytest.mark.parametrize("name,config", [
    ("qwen3", {"preset": "qwen3-tiny"}),
    ("qwen3_moe", {"preset": "qwen3-moe-tiny", "num_hidden_layers": 3, "mlp_only_layers": [1]}),
])
def test_parallel_plan_matches_the_built_model(name, config):
    spec = nxd.get_model(name)
    model = nxd.build_parallel_model(spec, config)
    assert plan_mismatches(model, spec.parallel_plan, {ExpertMLPs: "experts"}) == []
