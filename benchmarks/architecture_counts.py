"""Issue 31's architecture counts, reproducible: run it on any commit to get the closing note's numbers.

Over the first-party sources (``packages/*/src`` and ``registry/src``), by reading the code (``ast``),
nothing imported or run:

- ``global_reads``: calls that read the topology from the process-global state instead of a context
  passed in: ``parallel_state.<getter>()`` (any ``get_*``/``is_*``/``model_parallel_is_initialized``
  function of a module named ``parallel_state``, called through the module or imported by name),
  ``get_parallel_context()`` and ``current_parallel_context()``. Not counted: NxD's facade modules
  themselves (``parallel_state.py``, ``nxd/parallel.py`` where the global lives) and the NxD-API
  packages nxd-compat and nxd-lightning, whose public functions are NxD's and read the current
  context by NxD's contract.
- ``resolve_fallbacks``: calls of ``nxd.parallel.resolve_context`` (THE one fallback from an absent
  ``context=`` to the current context, meant for NxD-signature entry points only) or of a file's own
  function of that kind (one taking ``context`` that reads the global without it), by package.
- ``nxd_config_key_reads``: string-key reads of an NxD config as a dict (``nxd_config["key"]``,
  ``nxd_config.get("key")``, on a name or attribute called ``nxd_config``) instead of the typed
  ``nxd.resolved.NxdConfig`` attributes; nxd-compat and nxd-lightning included (their entry points
  receive NxD's dicts, but reading them typed is possible there too).
- ``fallbacks_taken`` (with ``--run``): the ``resolve_context(None)`` calls one tiny ``nxd train``
  step makes (benchmarks/step_walk.py's one-rank run), by caller: an internal that should have been
  handed the context shows up here; NxD's entry points called by user code do not run in it.
- ``duplicate_pairs``: pairs of places sharing 6+ same or same-shape lines with both sides in
  ``packages/*/src`` or ``registry/src``, from the ``duplicates`` tool when it is installed (each pair
  is a place to look, not a verdict: vendored NxD files and NxD's public signatures stay as NxD wrote them).

    python benchmarks/architecture_counts.py [--json] [--list] [--run] [--no-duplicates]
"""

from __future__ import annotations

import argparse
import ast
import json
import shutil
import subprocess
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted(ROOT.glob("packages/*/src")) + [ROOT / "registry" / "src"]
#: packages whose public API is NxD's own (the global current context is their contract)
NXD_API_PACKAGES = ("nxd-compat", "nxd-lightning")
#: the modules that hold the global or are NxD's getter facade
FACADE_MODULES = ("nxd_core_parallel/parallel_state.py", "nxd/parallel.py")
GLOBAL_FUNCTIONS = ("get_parallel_context", "current_parallel_context")
FALLBACK = "resolve_context"


def _package(path: Path) -> str:
    rel = path.relative_to(ROOT).parts
    return rel[1] if rel[0] == "packages" else "nxd (core)"


def _files() -> list[Path]:
    return sorted(p for src in SOURCES for p in src.rglob("*.py"))


def _is_getter(name: str) -> bool:
    return name.startswith(("get_", "is_")) or name == "model_parallel_is_initialized"


def _called_name(func: ast.expr) -> tuple[str | None, str]:
    """(the module-ish name before the dot or None, the function name) of a call's target."""
    if isinstance(func, ast.Name):
        return None, func.id
    if isinstance(func, ast.Attribute):
        owner = func.value
        owner_name = owner.id if isinstance(owner, ast.Name) else owner.attr if isinstance(owner, ast.Attribute) else None
        return owner_name, func.attr
    return None, ""


def _parallel_state_aliases(tree: ast.Module) -> tuple[set[str], set[str]]:
    """Names a ``parallel_state`` module is bound to in this file (``import ... parallel_state as ps``)
    and getters imported from one by name (``from ...parallel_state import get_x``)."""
    modules, getters = {"parallel_state"}, set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            for a in node.names:
                if a.name == "parallel_state":
                    modules.add(a.asname or a.name)
                elif (node.module or "").endswith("parallel_state") and _is_getter(a.name):
                    getters.add(a.asname or a.name)
        elif isinstance(node, ast.Import):
            modules |= {a.asname for a in node.names if a.asname and a.name.endswith(".parallel_state")}
    return modules, getters


def _scan(path: Path) -> dict[str, list[str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    modules, imported_getters = _parallel_state_aliases(tree)

    def is_global_read(node: ast.AST) -> bool:
        if not isinstance(node, ast.Call):
            return False
        owner, name = _called_name(node.func)
        return name in GLOBAL_FUNCTIONS or (owner in modules and _is_getter(name)) or (
            owner is None and name in imported_getters)

    # this file's own fallbacks: a function taking ``context`` that reads the global when it is absent
    # (``grads._context`` before issue 31); ``resolve_context`` is the shared one
    fallbacks = {FALLBACK} | {f.name for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)
                              and "context" in [a.arg for a in f.args.args + f.args.kwonlyargs]
                              and any(is_global_read(n) for n in ast.walk(f))}
    hits: dict[str, list[str]] = {"global": [], "fallback": [], "key": []}
    # the innermost function around each node, with its class (``LlamaAttention.__init__``)
    enclosing: dict[ast.AST, str] = {}

    def name_scopes(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                qualname = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    for inner in ast.walk(child):
                        enclosing[inner] = qualname
                name_scopes(child, f"{qualname}.")
            else:
                name_scopes(child, prefix)

    name_scopes(tree, "")
    where = lambda node: f"{path.relative_to(ROOT)}:{node.lineno}"  # noqa: E731
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            owner, name = _called_name(node.func)
            if is_global_read(node):
                hits["global"].append(f"{where(node)} {name}() in {enclosing.get(node, '<module>')}")
            elif name in fallbacks and (owner is None or name == FALLBACK):
                hits["fallback"].append(f"{where(node)} {name}() in {enclosing.get(node, '<module>')}")
            elif name == "get" and _is_nxd_config(node.func.value if isinstance(node.func, ast.Attribute) else None) \
                    and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                hits["key"].append(f"{where(node)} nxd_config.get({node.args[0].value!r})")
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and _is_nxd_config(node.value) \
                and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
            hits["key"].append(f"{where(node)} nxd_config[{node.slice.value!r}]")
    return hits


def _is_nxd_config(node: ast.expr | None) -> bool:
    return (isinstance(node, ast.Name) and node.id == "nxd_config") or (
        isinstance(node, ast.Attribute) and node.attr == "nxd_config")


def duplicate_pairs() -> list[str] | None:
    """``duplicates`` rows whose two sides are both first-party source (None: tool not installed)."""
    tool = shutil.which("duplicates")
    if tool is None:
        return None
    out = subprocess.run([tool, "--most", "200", "--seconds", "300"], cwd=ROOT, capture_output=True, text=True,
                         check=False).stdout
    rows = []
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[0].startswith("D") and parts[2] == "~":
            if all(("/src/" in side and (side.startswith(("packages/", "registry/")) or side.startswith("...")))
                   for side in (parts[1], parts[3])):
                rows.append(line)
    return rows


def fallbacks_taken() -> list[str]:
    """``caller (file:line)`` of every ``resolve_context`` call with no context during one tiny
    ``nxd train`` step (in this process, one rank, CPU)."""
    import sys
    import tempfile

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from step_walk import PRELOAD, tiny_run

    import nxd
    from nxd.cli import main as nxd_main

    nxd.plugins.state()
    for name in PRELOAD:
        __import__(name)
    target = nxd.parallel.resolve_context.__code__
    taken: list[str] = []

    def profile(frame, event: str, arg) -> None:
        if event == "call" and frame.f_code is target and frame.f_locals.get("context") is None:
            caller = frame.f_back
            taken.append(f"{Path(caller.f_code.co_filename).relative_to(ROOT)}:{caller.f_lineno} "
                         f"{caller.f_code.co_qualname}")

    with tempfile.TemporaryDirectory() as tmp:
        path = tiny_run(Path(tmp))
        sys.setprofile(profile)
        try:
            code = nxd_main(["train", str(path), "trainer.max_steps=1"])
        finally:
            sys.setprofile(None)
    if code != 0:
        raise SystemExit(f"architecture_counts: the tiny run failed (exit code {code})")
    return sorted(set(taken))


def counts(with_duplicates: bool = True, run: bool = False) -> dict:
    global_reads, fallbacks, keys = [], [], []
    for path in _files():
        rel = str(path.relative_to(ROOT))
        hits = _scan(path)
        keys += hits["key"]
        if any(rel.startswith(f"packages/{p}/") for p in NXD_API_PACKAGES) or rel.endswith(FACADE_MODULES):
            continue
        global_reads += hits["global"]
        fallbacks += hits["fallback"]
    by_package = lambda rows: dict(Counter(_package(ROOT / r.split(":")[0]) for r in rows).most_common())  # noqa: E731
    result = {
        "global_reads": len(global_reads), "global_reads_by_package": by_package(global_reads),
        "resolve_fallbacks": len(fallbacks), "resolve_fallbacks_by_package": by_package(fallbacks),
        "nxd_config_key_reads": len(keys), "nxd_config_key_reads_by_package": by_package(keys),
        "lists": {"global_reads": global_reads, "resolve_fallbacks": fallbacks, "nxd_config_key_reads": keys},
    }
    if run:
        taken = fallbacks_taken()
        result["fallbacks_taken"] = len(taken)
        result["lists"]["fallbacks_taken"] = taken
    if with_duplicates:
        pairs = duplicate_pairs()
        result["duplicate_pairs"] = None if pairs is None else len(pairs)
        result["lists"]["duplicate_pairs"] = pairs or []
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the counts as JSON")
    parser.add_argument("--list", action="store_true", help="also list every place counted")
    parser.add_argument("--no-duplicates", action="store_true", help="skip the duplicates tool (slowest part)")
    parser.add_argument("--run", action="store_true", help="also run one tiny nxd train step (fallbacks_taken)")
    args = parser.parse_args()
    result = counts(with_duplicates=not args.no_duplicates, run=args.run)
    if not args.list:
        result.pop("lists")
    if args.json:
        print(json.dumps(result, indent=1))
        return
    for key, value in result.items():
        if key != "lists":
            print(f"{key}: {value}")
    for name, rows in result.get("lists", {}).items():
        print(f"\n{name}:")
        print("\n".join(f"  {row}" for row in rows))


if __name__ == "__main__":
    main()
