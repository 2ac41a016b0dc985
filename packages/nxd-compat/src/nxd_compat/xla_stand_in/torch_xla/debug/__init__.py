"""torch_xla.debug (nxd-compat stand-in)."""
