"""``neuronx_distributed.lightning``: NxD's PyTorch Lightning classes on nxd (needs nxd's Lightning support:
``pip install nxd-compat[lightning]``)."""

from nxd_compat.lightning import *  # noqa: F403
from nxd_compat.lightning import __all__  # noqa: F401
