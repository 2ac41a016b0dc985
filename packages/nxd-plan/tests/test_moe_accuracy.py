"""MoE activations are planned, not left out: the meta forward routes the most rows an EP rank's
experts can receive (nxd_moe.max_routed_rows), and the plan of a tiny Mixtral run (2 gloo ranks,
``nxd train``'s loop, ``trainer.profile.profile_memory``) is printed beside the measured peak. The
measured peak depends on the machine's allocator, so only loose facts are asserted: activations are
measured (no lower-bound note), the plan names its routing assumption, and it is in the measured
peak's range (the table: docs/plan.md)."""

from __future__ import annotations

import copy
import tempfile

import pytest

from nxd_plan.planner import make_run_plan


def _measure(config: dict) -> int:
    from nxd_training.config import load_config
    from nxd_training.loop import train

    return train(load_config(config)).profile_peak_memory_bytes


@pytest.mark.slow
def test_moe_plan_holds_routed_rows_and_is_near_the_measured_peak(rank_pool, corpus) -> None:
    from nxd_plan.accuracy import MOE_VARIANTS, measurable_config

    config = measurable_config(corpus, tempfile.mkdtemp(), **copy.deepcopy(MOE_VARIANTS["moe_ep2"]))
    plan = make_run_plan(config)
    assert plan.activation_profile.measured, plan.activation_profile.notes
    assert any("max_routed_rows" in note for note in plan.activation_profile.notes), plan.activation_profile.notes
    measured = rank_pool(2).run(_measure, config, timeout=600)
    for rank, peak in enumerate(measured):
        planned = plan.ranks[rank].peak_bytes
        print(f"\nmoe_ep2 rank {rank}: planned {planned / 2**20:.2f} MiB, measured {peak / 2**20:.2f} MiB, "
              f"error {planned / peak - 1:+.1%}")
        assert 0.5 * peak < planned < 2.0 * peak, (rank, planned, peak)
