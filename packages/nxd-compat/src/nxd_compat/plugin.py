"""nxd plugin entry point for nxd-compat: no components, the package provides an import name."""

from __future__ import annotations

NXD_PLUGIN_API = (3, 3)  # plugin-API versions this plugin supports (inclusive range)
