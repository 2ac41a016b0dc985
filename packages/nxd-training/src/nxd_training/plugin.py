"""nxd plugin entry point for nxd-training: registers this package's components with the core."""

from __future__ import annotations

NXD_PLUGIN_API = (1, 1)  # plugin-API versions this plugin supports (inclusive range)
