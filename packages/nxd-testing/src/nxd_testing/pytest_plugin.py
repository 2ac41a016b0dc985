"""pytest plugin (entry point ``pytest11``, loaded in every package's test session): fixtures for
multi-rank tests, and the test tiers.

``pairs_file``: a JSONL preference set (:mod:`nxd_testing.preference_pairs`), written once per session.

``rank_pool(world_size)`` returns a :class:`nxd_testing.ranks.RankPool` shared by every test of
the session; asking for another world size stops the previous pool first (a 2-core machine
cannot hold many ranks at once).

Every collected test gets exactly one tier marker, from what it uses (:func:`tier_of`):
``launch`` (starts processes: ``nxd train``, torchrun, ``subprocess``; always ``slow`` too), ``ranks``
(the persistent rank pools) or ``unit`` (in-process).

The fast loop (``nox -s quick``) is ``pytest -m quick``: ``quick`` marks every unit or rank-pool test
not marked slow whose measured time (:data:`DURATIONS`, written by ``--store-durations``) is at most
:data:`QUICK_SECONDS`; a test with no measurement yet is quick until measured. A quick run lists
the tests that outgrew the budget (re-measure with ``nox -s durations``).
"""

from __future__ import annotations

import json
import os
import types
from collections.abc import Callable, Iterator
from pathlib import Path

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
#: each test's measured seconds (setup + call + teardown, one pytest over every package on the 2-core
#: machine), by node id relative to the repository root; ``--store-durations`` rewrites the entries it ran
DURATIONS = "test-durations.json"
#: a quick test's budget in DURATIONS; a quick run reports tests measured over QUICK_SECONDS * QUICK_SLACK
#: (the machine's load moves times by that much)
QUICK_SECONDS, QUICK_SLACK = 0.5, 4.0


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("nxd").addoption(
        "--store-durations", action="store_true",
        help=f"write each test's measured seconds into {DURATIONS} (what the quick marker reads)")


def pytest_configure(config: pytest.Config) -> None:
    for name, doc in TIERS.items():
        config.addinivalue_line("markers", f"{name}: {doc}")
    config.addinivalue_line("markers", "four_ranks: uses a 4-rank pool (scheduled after the 2-rank tests)")
    config.addinivalue_line("markers", f"quick: the fast loop, unit or rank-pool, not slow, measured <= {QUICK_SECONDS} s "
                                       f"in {DURATIONS} (marked automatically)")
    config.pluginmanager.register(_Durations(config), "nxd-durations")


def _durations_path(config: pytest.Config) -> Path:
    return config.rootpath / DURATIONS


def _recorded(config: pytest.Config) -> dict[str, float]:
    path = _durations_path(config)
    try:
        return json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError) as err:
        raise pytest.UsageError(f"{path}: not a JSON object of test ids to seconds ({err})") from err


def is_quick(item: pytest.Item, recorded: dict[str, float]) -> bool:
    """A unit or 2-rank pool test (starting 4 ranks on 2 cores costs more than the budget), not
    slow, measured within the budget (or not measured yet)."""
    return (tier_of(item) != "launch" and not any(item.get_closest_marker(m) for m in ("slow", "four_ranks"))
            and recorded.get(item.nodeid, 0.0) <= QUICK_SECONDS)


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
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    recorded = _recorded(config)
    for item in items:
        tier = tier_of(item)
        if item.get_closest_marker(tier) is None:
            item.add_marker(tier)
        if tier == "launch" and item.get_closest_marker("slow") is None:  # a launch is never the fast loop
            item.add_marker("slow")
        if is_quick(item, recorded):
            item.add_marker("quick")
    # changing the pool's world size restarts the ranks: every 4-rank test after the 2-rank ones
    items.sort(key=lambda item: item.get_closest_marker("four_ranks") is not None)


class _Durations:
    """Each test's measured seconds in this run: written with ``--store-durations``; in a quick run,
    the tests over the budget are listed."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.measured: dict[str, float] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.measured[report.nodeid] = self.measured.get(report.nodeid, 0.0) + report.duration

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        limit = QUICK_SECONDS * QUICK_SLACK
        over = {n: s for n, s in self.measured.items() if s > limit}
        if "quick" in (self.config.option.markexpr or "") and over:
            terminalreporter.write_sep("-", f"{len(over)} quick tests took over {limit:.0f} s (re-measure: nox -s durations)")
            for nodeid, seconds in sorted(over.items(), key=lambda kv: -kv[1]):
                terminalreporter.write_line(f"{seconds:6.1f} s  {nodeid}")
        if self.config.getoption("store_durations") and self.measured:
            path = _durations_path(self.config)
            stored = {**_recorded(self.config), **{n: round(s, 2) for n, s in self.measured.items()}}
            root = self.config.rootpath  # tests whose file moved or went are forgotten
            stored = {n: s for n, s in stored.items() if (root / n.split("::")[0]).is_file()}
            path.write_text(json.dumps(dict(sorted(stored.items())), indent=0) + "\n")
            terminalreporter.write_line(f"{len(self.measured)} test durations written to {path}")


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
