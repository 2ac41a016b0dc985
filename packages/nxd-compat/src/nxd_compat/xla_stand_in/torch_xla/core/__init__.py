"""torch_xla.core (nxd-compat stand-in)."""
