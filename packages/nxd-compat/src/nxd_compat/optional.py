"""NxD names whose implementation lives in an optional nxd plugin."""

from __future__ import annotations

import importlib.util


def require(module: str, nxd_name: str, distribution: str) -> None:
    """Raise an ImportError naming the distribution to install when ``module`` is missing."""
    if importlib.util.find_spec(module) is None:
        raise ImportError(f"{nxd_name} is provided by the {distribution} plugin, which is not installed: "
                          f"pip install {distribution}", name=nxd_name)
