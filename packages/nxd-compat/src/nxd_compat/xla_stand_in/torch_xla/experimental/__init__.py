"""torch_xla.experimental (nxd-compat stand-in)."""
