"""Shared helpers by name (fsdp_models.py; pytest runs in importlib mode), and every 4-rank test after
the 2-rank ones (changing the pool's world size restarts the ranks)."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "four_ranks: uses a 4-rank pool (scheduled after the 2-rank tests)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.get_closest_marker("four_ranks") is not None)
