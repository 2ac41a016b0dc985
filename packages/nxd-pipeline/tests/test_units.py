"""Single-process checks: schedules, partitioning, config validation, registration, split backward."""

from __future__ import annotations

import copy
import functools

import pytest
import torch
from torch.utils.checkpoint import checkpoint

import nxd
from nxd_pipeline import parse_pipeline_config, plan_stages, simulate
from nxd_pipeline import split_backward as sb
from nxd_pipeline.partition import prune_to_stages, stage_bounds_balanced
from nxd_pipeline.schedules import BUILTIN_SCHEDULES, interleaved_1f1b
from nxd_pipeline.toy import ToyLM, toy_batch

SCHEDULES = {s.name: s for s in BUILTIN_SCHEDULES}


def test_schedules_are_registered_through_the_core():
    for name in ("gpipe", "1f1b", "interleaved_1f1b", "zero_bubble"):
        assert nxd.get_schedule(name) is SCHEDULES[name]


@pytest.mark.parametrize("p,m", [(2, 2), (2, 4), (4, 4), (4, 8), (3, 7), (8, 16)])
def test_gpipe_and_1f1b_bubble_is_textbook(p, m):
    for name in ("gpipe", "1f1b"):
        assert simulate(SCHEDULES[name], p, m).bubble_fraction == pytest.approx((p - 1) / (m + p - 1))


@pytest.mark.parametrize("p,m,v", [(2, 2, 2), (2, 4, 2), (4, 4, 2), (4, 8, 2), (4, 8, 3)])
def test_interleaved_bubble_shrinks_by_the_virtual_stages(p, m, v):
    # with equal-cost chunks the idle share is (p-1)/(v*m + p-1): the 1F1B bubble divided by ~v
    assert simulate(SCHEDULES["interleaved_1f1b"], p, m, v).bubble_fraction == pytest.approx((p - 1) / (v * m + p - 1))


@pytest.mark.parametrize("p,m", [(2, 4), (4, 4), (4, 8), (4, 16)])
def test_zero_bubble_beats_1f1b_at_equal_work(p, m):
    costs = {"F": 1.0, "B": 2.0, "I": 1.0, "W": 1.0}
    zb = simulate(SCHEDULES["zero_bubble"], p, m, cost=costs).makespan
    one = simulate(SCHEDULES["1f1b"], p, m, cost=costs).makespan
    assert zb < one


def test_zero_bubble_keeps_1f1b_memory():
    for p, m in [(4, 8), (4, 16)]:
        for r in range(p):
            in_flight = peak = 0
            for a in SCHEDULES["zero_bubble"].actions(p, r, m):
                in_flight += {"F": 1, "W": -1}.get(a.kind, 0)
                peak = max(peak, in_flight)
            assert peak <= p - r


def test_simulate_rejects_broken_schedules():
    def missing_backward(p, r, m, v):
        return [a for a in SCHEDULES["1f1b"].actions(p, r, m) if a.microbatch != 1 or a.kind == "F"]

    def deadlock(p, r, m, v):  # backward before the forward it depends on
        return list(reversed(SCHEDULES["gpipe"].actions(p, r, m)))

    with pytest.raises(ValueError, match="exactly once"):
        simulate(missing_backward, 2, 4)
    with pytest.raises(ValueError, match="deadlock"):
        simulate(deadlock, 2, 4)


def test_interleaved_needs_divisible_microbatches():
    with pytest.raises(ValueError, match="divisible"):
        interleaved_1f1b(4, 0, 6, 2)


def test_partition_even_cuts_and_params():
    model = ToyLM(num_layers=7)
    assert [list(r) for r in plan_stages(model, 3)] == [[0, 1], [2, 3], [4, 5, 6]]  # remainder to the last (NxD)
    assert [list(r) for r in plan_stages(model, 3, ["layers.0", "layers.4"])] == [[0], [1, 2, 3, 4], [5, 6]]
    assert [list(r) for r in plan_stages(model, 2, [2])] == [[0, 1, 2], [3, 4, 5, 6]]
    assert [list(r) for r in stage_bounds_balanced([1, 1, 1, 1, 4], 2)] == [[0, 1, 2, 3], [4]]
    # the head's parameters weigh on the last stage
    assert [list(r) for r in stage_bounds_balanced([1.0] * 6, 2, last_extra=2.0)] == [[0, 1, 2, 3], [4, 5]]
    assert len(plan_stages(model, 3, partition_method="params")) == 3


@pytest.mark.parametrize("cuts,match", [(["layers.1"], "needs 2"), (["layers.3", "layers.1"], "increasing"),
                                        (["layers.6", "layers.7"], "out of range"), (["norm", "layers.2"], "not a transformer layer")])
def test_bad_cuts_name_the_key(cuts, match):
    with pytest.raises(nxd.ConfigError, match=match):
        plan_stages(ToyLM(num_layers=7), 3, cuts)


def test_pruning_keeps_global_names():
    model = ToyLM(num_layers=6, tie_embeddings=True)
    full = set(model.state_dict())
    bounds = plan_stages(model, 4)
    prune_to_stages(model, bounds, [1, 3])  # rank 1 of PP=2 with 2 virtual stages
    names = set(model.state_dict())
    assert names <= full
    assert {n.split(".")[1] for n in names if n.startswith("layers.")} == {str(i) for i in list(bounds[1]) + list(bounds[3])}
    assert "head.weight" in names and "embed.weight" not in names


@pytest.mark.parametrize("raw,match", [
    ({"num_microbatch": 4}, "did you mean 'num_microbatches'"),
    ({"num_microbatches": 0}, "num_microbatches must be a positive integer"),
    ({"pipeline_cuts": "layers.3"}, "pipeline_cuts must be a list"),
    ({"pipeline_cuts": ["layers.1", "layers.2"]}, "needs 1"),
    ({"output_loss_value_spec": (True, True)}, "exactly one True"),
    ({"partition_method": "flops"}, "partition_method"),
    ({"transformer_layer_cls": int}, "transformer_layer_cls"),
])
def test_pipeline_config_errors_name_the_key(raw, match):
    with pytest.raises(nxd.ConfigError, match=match):
        parse_pipeline_config(raw, 2)


def test_validation_runs_through_neuronx_distributed_config():
    with pytest.raises(nxd.ConfigError, match="did you mean 'num_microbatches'"):
        nxd.neuronx_distributed_config(pipeline_parallel_size=2, pipeline_config={"num_microbatch": 4})
    with pytest.raises(nxd.ConfigError, match="virtual stages"):
        nxd.neuronx_distributed_config(pipeline_parallel_size=2, pipeline_config={"schedule": "1f1b", "virtual_pipeline_size": 2})
    with pytest.raises(nxd.ComponentNotFound, match="zero_bubble_v"):
        nxd.neuronx_distributed_config(pipeline_parallel_size=2, pipeline_config={"schedule": "zero_bubble_v"})
    # virtual stages alone select the interleaved schedule, as NxD does
    assert parse_pipeline_config({"virtual_pipeline_size": 2}, 2).schedule == "interleaved_1f1b"


def test_split_backward_matches_autograd_even_under_activation_checkpointing():
    torch.manual_seed(0)
    model = ToyLM(num_layers=3, tie_embeddings=True)
    reference = copy.deepcopy(model)
    for layer in model.layers:
        inner = functools.partial(type(layer).forward, layer)
        layer.forward = lambda h, inner=inner: checkpoint(inner, h, use_reentrant=False)
    batch = toy_batch(2, 5)
    reference(**batch).backward()
    params = list(model.parameters())
    with sb.record_param_outputs(params) as rec:
        loss = model(**batch)
    sb.backward_input(rec, loss, None, None)
    assert all(p.grad is None for p in model.layers.parameters())  # the input pass computed no weight grad
    sb.backward_weight(rec)
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-6, atol=0)
