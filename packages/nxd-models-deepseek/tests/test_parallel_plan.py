"""The parallel plan (data on the spec) names exactly the parallel layers it makes of DeepSeek-V3, with
and without the q low-rank projection."""

from __future__ import annotations

import pytest

import nxd
from nxd_moe.experts import ExpertMLPs
from nxd_tensor_parallel.parallel_plan import plan_mismatches


@pytest.mark.parametrize("q_lora_rank", [32, None])
def test_parallel_plan_matches_the_built_model(q_lora_rank):
    spec = nxd.get_model("deepseek_v3")
    model = nxd.build_parallel_model(spec, {"preset": "deepseek-v3-tiny", "q_lora_rank": q_lora_rank})
    assert plan_mismatches(model, spec.parallel_plan, {ExpertMLPs: "experts"}) == []
