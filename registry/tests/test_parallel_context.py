"""The parallel context's rank layout (NxD's order: TP fastest, then CP, DP, PP; expert regions
re-read DP x CP as EDP x EP) and the current-context bookkeeping."""

from __future__ import annotations

import pytest

import nxd
from nxd.parallel import check_divisible, kv_shared_layout, rank_layout


def _group_of(layout: dict, name: str, rank: int) -> list[int]:
    return next(g for g in layout[name] if rank in g)


def test_layout_without_cp_ep_is_nxd_tp_dp_pp():
    layout = rank_layout(8, tp=2, pp=2)
    assert layout["tp"] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert layout["dp"] == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert layout["pp"] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    # size-1 dimensions still exist: every rank its own CP/EP group; EDP = DP, DP x CP = DP
    assert layout["cp"] == layout["ep"] == [[r] for r in range(8)]
    assert sorted(layout["edp"]) == sorted(layout["dp"]) == sorted(layout["dp_cp"])


def test_expert_layout_matches_nxd_docstring_example():
    # NxD initialize_model_parallel, EXAMPLE 2: 128 devices, TP=8, PP=4, EP=2 -> DP=4, DP_exp=2
    layout = rank_layout(128, tp=8, pp=4, ep=2)
    assert _group_of(layout, "pp", 0) == [0, 32, 64, 96]
    assert _group_of(layout, "dp", 0) == [0, 8, 16, 24]
    assert _group_of(layout, "edp", 0) == [0, 16] and _group_of(layout, "edp", 111) == [111, 127]
    assert _group_of(layout, "ep", 0) == [0, 8] and _group_of(layout, "ep", 119) == [119, 127] and _group_of(layout, "ep", 118) == [118, 126]
    assert _group_of(layout, "tp", 120) == list(range(120, 128))
    assert len(layout["edp"]) == len(layout["ep"]) == 64 and len(layout["dp"]) == 32


def test_context_parallel_sits_between_tp_and_dp():
    layout = rank_layout(8, tp=2, cp=2)
    assert _group_of(layout, "tp", 2) == [2, 3]
    assert _group_of(layout, "cp", 0) == [0, 2] and _group_of(layout, "cp", 5) == [5, 7]
    assert _group_of(layout, "dp", 0) == [0, 4]
    assert _group_of(layout, "dp_cp", 1) == [1, 3, 5, 7]
    # experts fold the data x context ranks: EP=4 spans them, EDP=1
    expert = rank_layout(8, tp=2, cp=2, ep=4)
    assert _group_of(expert, "ep", 0) == [0, 2, 4, 6] and _group_of(expert, "edp", 0) == [0]


def test_every_dimension_partitions_the_world():
    layout = rank_layout(24, tp=2, pp=2, cp=3, ep=2)
    for name, groups in layout.items():
        assert sorted(r for g in groups for r in g) == list(range(24)), name


def test_bad_sizes_name_the_fields():
    with pytest.raises(ValueError, match=r"world size 6 is not divisible by tensor_model_parallel_size \(4\)"):
        rank_layout(6, tp=4)
    with pytest.raises(ValueError, match=r"context_parallel_size \(4\)"):
        rank_layout(8, tp=4, cp=4)
    with pytest.raises(ValueError, match=r"expert_model_parallel_size \(3\) must divide"):
        rank_layout(8, ep=3)
    with pytest.raises(ValueError, match="tensor_model_parallel_size must be >= 1"):
        rank_layout(8, tp=0)
    assert check_divisible(12, a=2, b=3) == 2


def test_kv_shared_blocks_are_consecutive_tp_ranks():
    assert kv_shared_layout([[0, 1, 2, 3], [4, 5, 6, 7]], 2) == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_no_context_until_initialised():
    nxd.parallel.set_parallel_context(None)
    assert nxd.current_parallel_context() is None
    with pytest.raises(RuntimeError, match="model parallel is not initialized"):
        nxd.get_parallel_context()
    assert nxd.parallel.process_group_timeout() == nxd.parallel.DEFAULT_TIMEOUT
