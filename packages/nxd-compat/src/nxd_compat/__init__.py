"""nxd-compat: the opt-in ``neuronx_distributed`` import name on nxd, and ``nxd-compat-run``, which runs
an NxD script written for torch-xla on CPU or CUDA with a torch_xla stand-in.

Nothing here is imported by nxd itself: installing nxd-compat is the opt-in.
"""

__version__ = "0.1.0"
