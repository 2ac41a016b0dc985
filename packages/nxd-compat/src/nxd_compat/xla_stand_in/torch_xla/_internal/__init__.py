"""torch_xla._internal (nxd-compat stand-in)."""
