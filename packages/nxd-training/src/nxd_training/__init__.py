"""The YAML trainer, experiment manager and `nxd train`."""

__version__ = "0.1.0"
