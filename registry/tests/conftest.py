"""Core tests run with only the plugins they create: installed plugins are filtered out."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

import nxd.plugins


@pytest.fixture(autouse=True)
def fresh_plugins(monkeypatch):
    """Each test discovers plugins anew, with only the core loaded unless it says otherwise."""
    monkeypatch.setenv("NXD_LOAD_PLUGINS", "")
    monkeypatch.delenv("NXD_DISABLE_PLUGINS", raising=False)
    monkeypatch.delenv("NXD_STRICT_PLUGINS", raising=False)
    nxd.plugins.reset()
    yield
    nxd.plugins.reset()


@pytest.fixture
def fake_distribution(tmp_path, monkeypatch):
    """Create an installed-looking distribution (dist-info + module) that importlib.metadata
    discovers through sys.path, exactly as pip would leave it."""

    def make(dist: str, module: str, source: str, entry_name: str | None = None) -> str:
        root = tmp_path / "site"
        root.mkdir(exist_ok=True)
        (root / f"{module}.py").write_text(textwrap.dedent(source))
        info = root / f"{dist.replace('-', '_')}-1.2.3.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.2.3\n")
        (info / "entry_points.txt").write_text(f"[nxd.plugins]\n{entry_name or module} = {module}\n")
        if str(root) not in sys.path:
            monkeypatch.syspath_prepend(str(root))
        monkeypatch.delitem(sys.modules, module, raising=False)
        return entry_name or module

    return make


@pytest.fixture
def load_only(monkeypatch):
    """``load_only("a", "b")``: rediscover plugins, loading only those entry points/distributions."""

    def load(*names: str) -> None:
        monkeypatch.setenv("NXD_LOAD_PLUGINS", ",".join(names))
        nxd.plugins.reset()

    return load


@pytest.fixture
def repo_root() -> Path:
    return Path(__file__).resolve().parents[2]
