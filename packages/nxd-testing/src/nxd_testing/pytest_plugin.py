"""pytest plugin (entry point ``pytest11``): fixtures for multi-rank tests.

``rank_pool(world_size)`` returns a :class:`nxd_testing.ranks.RankPool` shared by every test of
the session; asking for another world size stops the previous pool first (a 2-core machine
cannot hold many ranks at once).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from nxd_testing.ranks import RankPool


class _Pools:
    def __init__(self) -> None:
        self.current: RankPool | None = None

    def get(self, world_size: int) -> RankPool:
        if self.current is not None and self.current.world_size != world_size:
            self.current.close()
            self.current = None
        if self.current is None:
            self.current = RankPool(world_size)
        return self.current

    def close(self) -> None:
        if self.current is not None:
            self.current.close()
            self.current = None


@pytest.fixture(scope="session")
def rank_pool() -> Iterator[Callable[[int], RankPool]]:
    """``rank_pool(n).run(fn, *args)`` runs module-level ``fn`` on ``n`` gloo ranks."""
    pools = _Pools()
    yield pools.get
    pools.close()
