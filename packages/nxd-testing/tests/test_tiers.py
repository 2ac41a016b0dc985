"""Test tiers: nxd-testing's pytest plugin marks every test unit, ranks or launch from what it uses."""

from __future__ import annotations

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
