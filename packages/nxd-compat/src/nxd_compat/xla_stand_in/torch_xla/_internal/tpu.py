"""torch_xla._internal.tpu (nxd-compat stand-in): no TPU devices (what torch-xla >= 2.1's
Lightning probe reads)."""

from torch_xla.experimental.tpu import num_available_devices, version  # noqa: F401
