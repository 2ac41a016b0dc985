"""pytest plugin for nxd: multi-rank process pools over real gloo groups and plugin conformance checks."""

from nxd_testing.ranks import RankError, RankPool, run_on_ranks

__version__ = "0.1.0"
__all__ = ["RankError", "RankPool", "run_on_ranks"]
