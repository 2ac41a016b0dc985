"""nxd plugin entry point for nxd-moe (a library: model plugins build on it; it registers no component)."""

from __future__ import annotations

NXD_PLUGIN_API = (1, 1)  # plugin-API versions this plugin supports (inclusive range)
