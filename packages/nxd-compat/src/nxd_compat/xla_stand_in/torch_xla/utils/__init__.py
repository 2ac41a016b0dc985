"""torch_xla.utils (nxd-compat stand-in)."""
