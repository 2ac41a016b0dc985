"""nxd plugin entry point for nxd-moe: a library for model plugins; it registers no component (its
presence is what lets a core-only install name the package to install for ``model.moe``)."""

from __future__ import annotations

NXD_PLUGIN_API = (1, 1)  # plugin-API versions this plugin supports (inclusive range)
