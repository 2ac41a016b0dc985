"""``FSDPModel``: NxD's step contract (``run_train``/``run_eval``) over a ``fully_shard``-ed module."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from nxd_core_parallel.trainer import NxDModel
from nxd_fsdp.config import FsdpConfig


class FSDPModel(NxDModel):
    """``NxDModel`` whose module is sharded by ``fully_shard``: gradients are reduce-scattered over
    the mesh during backward (no all-reduce in the optimizer). Gradient accumulation
    (``run_train(*micro_batches)``) runs every micro-batch but the last under :meth:`no_sync`."""

    def __init__(self, module: nn.Module, nxd_config: dict | None, mesh: DeviceMesh, fsdp_config: FsdpConfig) -> None:
        super().__init__(module, nxd_config)
        self.fsdp_mesh = mesh
        self.fsdp_config = fsdp_config

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward inside accumulates unsharded gradients locally (no reduce-scatter) and keeps the
        gathered parameters (no reshard, no all-gather again for the next micro-batch); the first
        backward outside reduces the sum once."""
        module = self.module
        if not hasattr(module, "set_requires_gradient_sync"):  # a pipeline: its schedule runs the micro-batches
            yield
            return
        module.set_requires_gradient_sync(False)
        module.set_reshard_after_backward(False)
        try:
            yield
        finally:
            module.set_requires_gradient_sync(True)
            module.set_reshard_after_backward(True)
