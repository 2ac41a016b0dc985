"""``neuronx_distributed.lightning.launcher``: NxD's XLA process launcher is not provided; start
ranks with torchrun (``NeuronXLAStrategy`` joins the process group torchrun set up)."""

from nxd_compat.surface import not_provided

__getattr__ = not_provided(__name__, {"_NeuronXLALauncher": "launch ranks with torchrun"})
