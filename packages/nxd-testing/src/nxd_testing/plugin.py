"""nxd plugin entry point for nxd-testing (registers nothing; present so `nxd plugins` lists it)."""

from __future__ import annotations

NXD_PLUGIN_API = (3, 3)  # plugin-API versions this plugin supports (inclusive range)
