"""The family's parallel plan (data on its ModelSpec) names exactly the parallel layers it builds."""

from __future__ import annotations

import nxd
from nxd_core_parallel.parallel_plan import plan_mismatches

CONFIG = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2)


def test_parallel_plan_matches_the_built_model():
    spec = nxd.get_model("llama")
    model = spec.build(spec.config_from_dict(CONFIG))
    assert spec.parallel_plan is not None
    assert plan_mismatches(model, spec.parallel_plan) == []
