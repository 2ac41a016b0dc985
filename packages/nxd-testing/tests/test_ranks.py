"""The rank pool runs bodies on real gloo ranks, reports failures from any rank, and recovers."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from nxd_testing import RankError


def _all_reduce_rank() -> tuple[int, float]:
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    return dist.get_rank(), t.item()


def _fail_on_rank_one() -> int:
    if dist.get_rank() == 1:
        raise ValueError("boom on rank one")
    return dist.get_rank()


def _hang_on_rank_zero() -> None:
    if dist.get_rank() == 0:
        dist.barrier()  # rank 1 never joins: the pool must time out, not hang the test


def test_all_reduce_on_two_ranks(rank_pool):
    assert rank_pool(2).run(_all_reduce_rank) == [(0, 3.0), (1, 3.0)]


def test_failure_on_one_rank_fails_the_call_and_pool_recovers(rank_pool):
    pool = rank_pool(2)
    with pytest.raises(RankError, match="boom on rank one"):
        pool.run(_fail_on_rank_one)
    assert pool.run(_all_reduce_rank) == [(0, 3.0), (1, 3.0)]


def test_hung_collective_times_out(rank_pool):
    pool = rank_pool(2)
    with pytest.raises(RankError, match="did not finish"):
        pool.run(_hang_on_rank_zero, timeout=5)
    assert pool.run(_all_reduce_rank)[1] == (1, 3.0)


def test_local_functions_are_refused(rank_pool):
    def local():
        return 1

    with pytest.raises(ValueError, match="module-level"):
        rank_pool(2).run(local)


def _env(name: str) -> str | None:
    import os

    return os.environ.get(name)


def test_a_tests_environment_does_not_reach_the_session_pools_ranks(rank_pool, monkeypatch):
    """The pool outlives the test that starts it: its ranks get the session's environment, never
    this test's monkeypatched one (it would reach every later test's ranks)."""
    pool = rank_pool(2)
    pool.close()  # the next get() starts the ranks inside this test
    monkeypatch.setenv("NXD_TEST_LEAK", "1")
    assert rank_pool(2).run(_env, "NXD_TEST_LEAK") == [None, None]
