"""Issue 31's ratchet, over every package's source (benchmarks/architecture_counts.py, by reading the
code): nxd's internals take the parallel context they are handed and read the typed NxD config."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: the functions that set the current context: they read it to keep one of the same sizes
CONTEXT_SETTERS = {"start_parallel_context", "initialize_parallel"}


def _counts() -> dict:
    spec = importlib.util.spec_from_file_location("architecture_counts", ROOT / "benchmarks" / "architecture_counts.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.counts(with_duplicates=False)


def test_no_global_topology_reads_or_nxd_config_key_reads_in_internals() -> None:
    lists = _counts()["lists"]
    reads = [r for r in lists["global_reads"] if r.rsplit(" in ", 1)[-1] not in CONTEXT_SETTERS]
    assert not reads, (
        "global topology reads outside NxD's facades: pass the ParallelContext the caller was given "
        "(or nxd.parallel.resolve_context(context) at an NxD-signature entry point):\n  " + "\n  ".join(reads))
    assert not lists["nxd_config_key_reads"], (
        "string-key reads of an NxD config: read the typed nxd.resolved.NxdConfig attribute instead:\n  "
        + "\n  ".join(lists["nxd_config_key_reads"]))
