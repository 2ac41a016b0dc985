"""torch-xla's "xser" layout with torch alone: nxd-ckpt's implementation (one class pickled under
torch-xla's name), used by the stand-in's ``torch_xla.utils.serialization`` and ``parallel_layers.save``."""

from nxd_ckpt.xser import (
    TensorReference,
    is_xser,
    load,
    reading_references,
    resolve_references,
    save,
    tensor_file,
)

__all__ = ["TensorReference", "is_xser", "load", "reading_references", "resolve_references", "save", "tensor_file"]
