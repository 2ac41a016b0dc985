"""torch_xla.distributed (nxd-compat stand-in)."""
