"""nxd plan."""
