"""torch_xla.experimental.tpu (nxd-compat stand-in): there is no TPU. Lightning's XLA accelerator
probes this to count devices; ``version()`` raising ValueError makes it report "not available"."""


def version() -> int:
    raise ValueError("nxd-compat's torch_xla stand-in: no TPU (the run uses nxd's CPU/CUDA backend)")


def num_available_devices() -> int:
    return 0
