"""nxd plugin entry point for nxd-modeling (a library the model families share: registers nothing;
present so `nxd plugins` lists it)."""

from __future__ import annotations

NXD_PLUGIN_API = (4, 4)  # plugin-API versions this plugin supports (inclusive range)
