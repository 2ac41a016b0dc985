"""torch_xla.distributed.xla_backend (nxd-compat stand-in): importing it registers the ``xla``
process-group backend, which ``nxd-compat-run`` has already registered (gloo on CPU, NCCL on CUDA).
NxD's examples up to Release 2.18 import it before ``init_process_group("xla")``."""
