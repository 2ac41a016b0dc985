"""Test tiers: nxd-testing's pytest plugin marks every test unit, ranks or launch from what it uses."""

from __future__ import annotations

import json

pytest_plugins = ["pytester"]

PLAIN = """
import pytest

def test_plain():
    pass

def test_pool(rank_pool):
    pass

@pytest.mark.launch
def test_marked():
    pass

@pytest.mark.slow
def test_slow_unit():
    pass
"""
RANK_NAMES = "from nxd_testing.ranks import run_on_ranks\n\ndef test_uses_run_on_ranks():\n    pass\n"
SUBPROCESS = "import subprocess\n\ndef test_imports_subprocess():\n    pass\n"


def test_each_test_gets_the_tier_of_what_it_uses_before_m_selects(pytester):
    pytester.makeini("[pytest]\nmarkers =\n    slow: slow\n")
    pytester.makepyfile(test_plain=PLAIN, test_rank_names=RANK_NAMES, test_subprocess=SUBPROCESS)
    # the plugin is loaded by its pytest11 entry point, as in every package's session
    run = pytester.inline_run("--strict-markers", "--co", "-m", "not slow")  # launches are slow too
    selected = run.getcall("pytest_collection_finish").session.items
    deselected = [item for call in run.getcalls("pytest_deselected") for item in call.items]
    tiers = {item.name: [m.name for m in item.iter_markers() if m.name in ("unit", "ranks", "launch")]
             for item in selected + deselected}
    assert tiers == {"test_plain": ["unit"], "test_pool": ["ranks"], "test_marked": ["launch"],
                     "test_slow_unit": ["unit"], "test_uses_run_on_ranks": ["ranks"], "test_imports_subprocess": ["launch"]}
    assert sorted(item.name for item in selected) == ["test_plain", "test_pool", "test_uses_run_on_ranks"]


QUICK = """
import pytest

def test_fast():
    pass

def test_measured_slow():
    pass

def test_new():
    pass

@pytest.mark.four_ranks
def test_four(rank_pool):
    pass

@pytest.mark.slow
def test_slow():
    pass
"""


def test_quick_is_what_was_measured_within_the_budget(pytester):
    from nxd_testing.pytest_plugin import DURATIONS, QUICK_SECONDS

    pytester.makeini("[pytest]\nmarkers =\n    slow: slow\n")
    pytester.makepyfile(test_quick=QUICK)
    pytester.path.joinpath(DURATIONS).write_text(json.dumps(
        {"test_quick.py::test_fast": QUICK_SECONDS / 2, "test_quick.py::test_measured_slow": QUICK_SECONDS * 2}))
    run = pytester.inline_run("--strict-markers", "--co", "-m", "quick")
    selected = run.getcall("pytest_collection_finish").session.items
    # not yet measured counts as quick; 4 ranks and slow never do
    assert sorted(item.name for item in selected) == ["test_fast", "test_new"]


def test_store_durations_writes_what_ran(pytester):
    from nxd_testing.pytest_plugin import DURATIONS

    pytester.makepyfile(test_one="def test_one():\n    pass\n")
    pytester.path.joinpath(DURATIONS).write_text(json.dumps({"test_one.py::test_not_run": 9.0, "gone.py::test_x": 9.0}))
    pytester.inline_run("--store-durations").assertoutcome(passed=1)
    stored = json.loads(pytester.path.joinpath(DURATIONS).read_text())
    # what ran is (re)written, what did not run is kept, a test file that is gone is forgotten
    assert stored.keys() == {"test_one.py::test_not_run", "test_one.py::test_one"} and stored["test_one.py::test_one"] < 1
