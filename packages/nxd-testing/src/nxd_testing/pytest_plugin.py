"""pytest plugin (entry point ``pytest11``, loaded in every package's test session): fixtures for
multi-rank tests, and the test tiers.

``pairs_file``: a JSONL preference set (:mod:`nxd_testing.preference_pairs`), written once per session.

``rank_pool(world_size)`` returns a :class:`nxd_testing.ranks.RankPool` shared by every test of
the session; asking for another world size stops the previous pool first (a 2-core machine
cannot hold many ranks at once).

Every collected test gets exactly one tier marker, from what it uses (:func:`tier_of`):
``launch`` (starts processes: ``nxd train``, torchrun, ``subprocess``; always ``slow`` too), ``ranks``
(the persistent rank pools) or ``unit`` (in-process). The fast loop is ``pytest -m "not slow"``
(``nox -s quick``): unit and fast rank-pool tests, no launch.
"""

from __future__ import annotations

import os
import types
from collections.abc import Callable, Iterator

import pytest

from nxd_testing.ranks import RankPool, run_on_ranks

TIERS = {
    "unit": "in-process test (marked automatically)",
    "ranks": "uses nxd-testing's rank pools: the rank_pool fixture, RankPool or run_on_ranks (marked automatically)",
    "launch": "starts processes: nxd train, torchrun, subprocess (marked automatically when the test module "
              "imports subprocess; a module that launches otherwise sets pytestmark = pytest.mark.launch)",
}
#: fixtures that hand a test the rank pools
RANK_FIXTURES = frozenset({"rank_pool"})


def pytest_configure(config: pytest.Config) -> None:
    for name, doc in TIERS.items():
        config.addinivalue_line("markers", f"{name}: {doc}")
    config.addinivalue_line("markers", "four_ranks: uses a 4-rank pool (scheduled after the 2-rank tests)")


def tier_of(item: pytest.Item) -> str:
    """``launch``, ``ranks`` or ``unit``: an explicit tier marker first, then what the test uses (its
    fixtures, its module's ``subprocess`` import or rank-pool names); cheap, no source is read."""
    for tier in ("launch", "ranks", "unit"):
        if item.get_closest_marker(tier) is not None:
            return tier
    module = getattr(item, "module", None)
    names = vars(module) if module is not None else {}
    if isinstance(names.get("subprocess"), types.ModuleType):
        return "launch"
    if RANK_FIXTURES.intersection(getattr(item, "fixturenames", ())) or any(
            value is RankPool or value is run_on_ranks for value in names.values()):
        return "ranks"
    return "unit"


@pytest.hookimpl(tryfirst=True)  # before -m deselects by these markers
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        tier = tier_of(item)
        if item.get_closest_marker(tier) is None:
            item.add_marker(tier)
        if tier == "launch" and item.get_closest_marker("slow") is None:  # a launch is never the fast loop
            item.add_marker("slow")
    # changing the pool's world size restarts the ranks: every 4-rank test after the 2-rank ones
    items.sort(key=lambda item: item.get_closest_marker("four_ranks") is not None)


class _Pools:
    """The session's one pool. Its ranks outlive the test that started them, so they start with the
    environment the session had, never that test's (a test's ``monkeypatch.setenv`` such as the
    core's ``NXD_LOAD_PLUGINS=""`` would otherwise reach every later test's ranks)."""

    def __init__(self) -> None:
        self.current: RankPool | None = None
        self.environ = dict(os.environ)

    def get(self, world_size: int) -> RankPool:
        if self.current is not None and self.current.world_size != world_size:
            self.current.close()
            self.current = None
        if self.current is None:
            self.current = RankPool(world_size)
        if not self.current.started:  # also after a failure stopped the ranks
            test_environ = dict(os.environ)
            os.environ.clear()
            os.environ.update(self.environ)
            try:
                self.current.start()
            finally:
                os.environ.clear()
                os.environ.update(test_environ)
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


@pytest.fixture(scope="session")
def pairs_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A preference set (``{prompt, chosen, rejected}`` JSONL) whose chosen responses follow a learnable rule."""
    from nxd_testing.preference_pairs import write_preference_pairs

    return str(write_preference_pairs(tmp_path_factory.mktemp("pairs") / "data_dpo.jsonl"))
