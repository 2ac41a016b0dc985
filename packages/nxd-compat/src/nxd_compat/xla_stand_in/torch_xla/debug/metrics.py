"""torch_xla.debug.metrics (nxd-compat stand-in): there is no XLA graph compiler here, so no XLA
counters or metrics exist (NxD's BERT example up to Release 2.18 imports this module)."""

from typing import Any


def metrics_report() -> str:
    return "no XLA metrics: nxd-compat-run runs on nxd's CPU/CUDA backend, not XLA"


def counter_names() -> list[str]:
    return []


def metric_names() -> list[str]:
    return []


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    raise RuntimeError(f"torch_xla.debug.metrics.{name} reads XLA's compiler metrics; nxd-compat-run runs without "
                       "XLA, where metrics_report(), counter_names() and metric_names() say there are none")
