"""torch_xla.experimental.pjrt_backend (nxd-compat stand-in): importing it registers nothing more;
the ``xla`` process-group backend is already registered."""
