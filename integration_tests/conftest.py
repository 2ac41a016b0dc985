"""Shared fixtures: wheels of every nxd distribution, built once per session."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def uv() -> list[str]:
    found = shutil.which("uv")
    return [found] if found else [sys.executable, "-m", "uv"]


def run(cmd: list[str], check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    env = {**os.environ, "UV_FIND_LINKS": os.environ.get("UV_FIND_LINKS") or os.environ.get("PIP_FIND_LINKS", "")}
    env.pop("NXD_LOAD_PLUGINS", None)
    env.pop("VIRTUAL_ENV", None)
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, **kwargs)
    if result.returncode != 0 and check:
        raise AssertionError(f"{' '.join(map(str, cmd))} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return result


@pytest.fixture(scope="session")
def wheelhouse(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheels")
    folders = [ROOT / "registry", *sorted(p.parent for p in (ROOT / "packages").glob("*/pyproject.toml"))]
    for folder in folders:
        run([*uv(), "build", "--wheel", "--quiet", "--out-dir", str(out), str(folder)])
    return out


@pytest.fixture(scope="session")
def fresh_venv(tmp_path_factory, wheelhouse):
    """A new venv; ``install(*requirements)`` installs from the wheelhouse only (plus PyPI deps)."""
    venv = tmp_path_factory.mktemp("venv") / "env"
    run([*uv(), "venv", "--quiet", str(venv)])
    python = venv / "bin" / "python"

    class Venv:
        bin = venv / "bin"

        def install(self, *requirements: str) -> None:
            """Install nxd distributions by name from the wheelhouse (by file: PyPI has an unrelated
            project called "nxd"), or other requirements (folders) as given."""
            resolved = []
            for req in requirements:
                wheels = [] if "/" in req else sorted(wheelhouse.glob(f"{req.replace('-', '_')}-*.whl"))
                resolved.append(str(wheels[-1]) if wheels else req)
            run([*uv(), "pip", "install", "--quiet", "--python", str(python), "-c", str(ROOT / "constraints.txt"),
                 *resolved])

        def nxd(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
            return run([str(self.bin / "nxd"), *args], check=check)

    return Venv()
