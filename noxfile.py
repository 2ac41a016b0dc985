"""nox sessions: one test session per package (installing only that package and its declared
dependencies, which proves "pip install only the plugins you need"), plus lint, integration,
interop (peers such as torchtitan installed for real), bench, and the optional xla session.

Run everything the README's test command runs:  bash scripts/test.sh
One package:                                     bash scripts/test.sh -s tests-nxd-ckpt
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import nox
import tomllib

ROOT = Path(__file__).parent
CONSTRAINTS = str(ROOT / "constraints.txt")

nox.options.default_venv_backend = "uv"
nox.options.reuse_venv = "yes"
nox.options.error_on_missing_interpreters = True

os.environ.setdefault("UV_FIND_LINKS", os.environ.get("PIP_FIND_LINKS", ""))
# Compiling every installed module's bytecode up front costs minutes per venv (measured: 177 s vs
# 12 s for the core's venv); letting Python cache bytecode of the modules tests actually import
# gives the same fast second import for a fraction of the time.
os.environ["UV_COMPILE_BYTECODE"] = "0"
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)


def _package_dirs() -> dict[str, Path]:
    dirs = {"nxd": ROOT / "registry"}
    for pyproject in sorted((ROOT / "packages").glob("*/pyproject.toml")):
        dirs[tomllib.loads(pyproject.read_text())["project"]["name"]] = pyproject.parent
    return dirs


PACKAGES = _package_dirs()


def _requirement_name(req: str) -> str:
    return re.split(r"[\s\[<>=!~;]", req, maxsplit=1)[0].lower()


def _local_deps(dist: str, extras: tuple[str, ...] = ()) -> set[str]:
    """The nxd distributions ``dist`` needs (with ``extras``), transitively."""
    project = tomllib.loads((PACKAGES[dist] / "pyproject.toml").read_text())["project"]
    reqs = list(project.get("dependencies", []))
    for extra in extras:
        reqs += project.get("optional-dependencies", {}).get(extra, [])
    found: set[str] = set()
    for name in map(_requirement_name, reqs):
        if name in PACKAGES and name not in found:
            found |= {name} | _local_deps(name)
    return found


def install_packages(session: nox.Session, dist: str, extras: tuple[str, ...] = ("test",)) -> None:
    """Install ``dist`` (with ``extras``) and the local nxd packages it declares, from their folders."""
    suffix = f"[{','.join(extras)}]" if extras else ""
    targets = [str(PACKAGES[name]) for name in sorted(_local_deps(dist, extras) - {dist})]
    session.install("-c", CONSTRAINTS, f"{PACKAGES[dist]}{suffix}", *targets)


def _make_test_session(dist: str) -> None:
    @nox.session(name=f"tests-{dist}")
    def tests(session: nox.Session) -> None:
        install_packages(session, dist)
        tests_dir = PACKAGES[dist] / "tests"
        session.run("pytest", str(tests_dir), *session.posargs, success_codes=[0, 5] if not any(tests_dir.glob("test_*.py")) else [0])

    tests.__doc__ = f"Tests of {dist}, in a venv holding only {dist} and its declared dependencies."


for _dist in PACKAGES:
    _make_test_session(_dist)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff over the whole repository."""
    session.install("-c", CONSTRAINTS, "ruff")
    session.run("ruff", "check", ".")


@nox.session
def integration(session: nox.Session) -> None:
    """Cross-package tests: wheels into fresh venvs, discovery of subsets, a third-party plugin."""
    install_packages(session, "nxd-testing", extras=())
    session.install("-c", CONSTRAINTS, "pytest", "pytest-timeout")
    session.run("pytest", str(ROOT / "integration_tests"), "--ignore", str(COMPOSITION), "--ignore", str(INTEROP),
                *session.posargs)


#: integration_tests/ folders with sessions of their own (they need every plugin, or the peers installed)
COMPOSITION = ROOT / "integration_tests" / "composition"
INTEROP = ROOT / "integration_tests" / "interop"


@nox.session
def composition(session: nox.Session) -> None:
    """The composition matrix (docs/composition.md): every pair of the features users combine,
    through ``nxd train``'s own path, with every first-party plugin installed."""
    session.install("-c", CONSTRAINTS, *(str(path) for path in PACKAGES.values()),
                    f"{PACKAGES['nxd-data']}[hf]", "pytest", "pytest-timeout", "transformers", "peft", "safetensors")
    session.run("pytest", str(COMPOSITION), *session.posargs)


#: torchtitan 0.3.0 pins ``datasets<4.8`` (constraints.txt: 5.2.0, which it runs with), so the resolver
#: cannot place it beside the pinned stack: it goes in with ``--no-deps`` after what it imports.
TORCHTITAN = "torchtitan==0.3.0"
TORCHTITAN_IMPORTS = ("tyro", "docstring_parser", "typeguard", "shtab", "rich", "spmd_types==0.2.3", "torch_checkpointing",
                      "torchdata", "einops", "triton", "datasets", "tokenizers", "tensorboard", "pillow")


@nox.session
def interop(session: nox.Session) -> None:
    """Peers installed for real on the other side of nxd's interop claims (integration_tests/interop/): torchtitan
    0.3.0 (its model, optimizer, loss and CheckpointManager) with nxd-torchtitan."""
    install_packages(session, "nxd-torchtitan")
    session.install("-c", CONSTRAINTS, str(PACKAGES["nxd-fsdp"]), *TORCHTITAN_IMPORTS)  # nxd's side trains FSDP
    session.install("--no-deps", TORCHTITAN)
    session.run("pytest", str(INTEROP), *session.posargs)


def _dev_pytest(session: nox.Session, *args: str) -> None:
    """pytest in the one editable ``.venv`` of scripts/dev-env.sh (made on first use), one process over
    every package's tests; paths among the arguments after ``--`` narrow it to them."""
    python = ROOT / ".venv" / "bin" / "python"
    if not python.exists():
        session.run("bash", str(ROOT / "scripts" / "dev-env.sh"), external=True)
    paths = [arg for arg in session.posargs if not arg.startswith("-")]
    tests = [] if paths else [str(PACKAGES[d] / "tests") for d in PACKAGES if (PACKAGES[d] / "tests").is_dir()]
    session.run(str(python), "-m", "pytest", *args, *tests, *session.posargs, external=True)


@nox.session(default=False, venv_backend="none")
def quick(session: nox.Session) -> None:
    """The development loop (under 2 minutes on 2 cores): the ``quick`` tests of every package, unit
    and rank-pool tests measured at most 0.5 s each (nxd-testing's pytest plugin marks them from
    test-durations.json; docs/contributing.md). Not CI: ``bash scripts/test.sh`` still runs everything."""
    _dev_pytest(session, "-m", "quick", "-q")


@nox.session(default=False, venv_backend="none")
def durations(session: nox.Session) -> None:
    """Re-measure test-durations.json (what ``quick`` selects by): every unit and rank-pool test not
    marked slow, timed in one process (measured: 320 s CPU, 9 min wall at load 5-13)."""
    _dev_pytest(session, "-m", "not slow", "-q", "--store-durations")


@nox.session(default=False)
def bench(session: nox.Session) -> None:
    """Side-by-side benchmarks against torch-native peers (prints ratio tables)."""
    for dist in PACKAGES:
        install_packages(session, dist, extras=())
    session.install("-c", CONSTRAINTS, "transformers", "peft")
    scripts = session.posargs or sorted(str(p) for p in (ROOT / "benchmarks").glob("bench_*.py"))
    for script in scripts:
        session.run("python", script)


@nox.session(default=False)
def gpu(session: nox.Session) -> None:
    """Optional, on a CUDA machine: the ``@pytest.mark.gpu`` tests (quickstart, TP=1 bf16 with
    checkpoint save/resume, ZeRO-1, LoRA on one GPU). Uses the machine's CUDA torch: the session
    installs the packages without the CPU torch pin (``--no-deps`` is not used, torch must already
    satisfy them)."""
    session.install(*(str(PACKAGES[d]) for d in ("nxd", "nxd-core-parallel", "nxd-zero1", "nxd-lora",
                                                   "nxd-models-llama", "nxd-data", "nxd-ckpt", "nxd-testing")),
                    f"{PACKAGES['nxd-training']}[test]", "liger-kernel")
    session.run("pytest", "-m", "gpu", str(PACKAGES["nxd-training"] / "tests" / "test_gpu.py"),
                str(PACKAGES["nxd-models-llama"] / "tests" / "test_fused_kernels.py"),
                str(PACKAGES["nxd-ckpt"] / "tests" / "test_gpu_snapshots.py"), *session.posargs)


#: torch-xla needs its own matching torch (not the CPU torch pinned in constraints.txt).
XLA_TORCH = os.environ.get("NXD_XLA_TORCH", "torch==2.8.0")
XLA_TORCH_XLA = os.environ.get("NXD_XLA_TORCH_XLA", "torch-xla==2.8.0")


@nox.session(default=False)
def xla(session: nox.Session) -> None:
    """Optional: nxd-core-parallel's xla backend, single process on the XLA CPU device. Installs
    torch-xla (several GB) in its own venv; not part of the default test command."""
    # One resolve, so the packages' unpinned "torch" requirement keeps torch-xla's torch.
    session.install(XLA_TORCH, XLA_TORCH_XLA, str(PACKAGES["nxd"]), str(PACKAGES["nxd-core-parallel"]),
                    str(PACKAGES["nxd-tensor-parallel"]))
    session.run("python", str(PACKAGES["nxd-core-parallel"] / "xla" / "xla_smoke.py"),
                env={"PJRT_DEVICE": "CPU", "NXD_BACKEND": "xla"})


nox.options.sessions = ["lint", *(f"tests-{d}" for d in PACKAGES), "integration", "interop", "composition"]
