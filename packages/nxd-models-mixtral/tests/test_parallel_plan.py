"""The family's parallel plan (data on its ModelSpec) names exactly the parallel layers it makes of the plain build."""

from __future__ import annotations

import nxd
from nxd_moe.experts import ExpertMLPs
from nxd_tensor_parallel.parallel_plan import plan_mismatches

CONFIG = dict(vocab_size=128, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2)


def test_parallel_plan_matches_the_built_model():
    spec = nxd.get_model("mixtral")
    model = nxd.build_parallel_model(spec, CONFIG)
    assert spec.parallel_plan is not None
    assert plan_mismatches(model, spec.parallel_plan, {ExpertMLPs: "experts"}) == []
