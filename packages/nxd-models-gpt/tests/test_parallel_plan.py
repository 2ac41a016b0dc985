"""The family's parallel plan (data on its ModelSpec) names exactly the parallel layers it makes of the plain build."""

from __future__ import annotations

import nxd
from nxd_tensor_parallel.parallel_plan import plan_mismatches

CONFIG = dict(vocab_size=128, n_embd=64, n_layer=2, n_head=4, n_positions=64, model_type="gpt2")


def test_parallel_plan_matches_the_built_model():
    spec = nxd.get_model("gpt")
    model = nxd.build_parallel_model(spec, CONFIG)
    assert spec.parallel_plan is not None
    assert plan_mismatches(model, spec.parallel_plan) == []
