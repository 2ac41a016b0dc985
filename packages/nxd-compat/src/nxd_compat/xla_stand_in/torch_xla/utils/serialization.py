"""torch_xla.utils.serialization (nxd-compat stand-in): torch-xla's "xser" layout with torch alone."""

from nxd_compat.xser import TensorReference, load, save

__all__ = ["TensorReference", "load", "save"]
