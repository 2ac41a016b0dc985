"""``neuronx_distributed.parallel_layers.comm``: NxD's torch-xla-style collectives (replica-group
meshes, a CPU reduce-scatter for its XLA CPU mode). Not provided: nxd runs torch.distributed."""

from neuronx_distributed.utils.logger import get_logger
from nxd_compat.surface import not_provided

logger = get_logger()

_USE = ("call torch.distributed directly, or the torch_xla stand-in's xm.all_reduce / xm.all_gather "
        "(same replica-group forms) under nxd-compat-run")
__getattr__ = not_provided(__name__, {n: _USE for n in (
    "all_reduce", "all_gather", "reduce_scatter", "cpu_reduce_scatter", "gloo_reduce_scatter", "_get_group_mesh")})
