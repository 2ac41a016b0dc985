"""One rank of a world that does not exist: torch's fake process-group backend (every collective
returns at once) and the meta device (shapes without storage), so the real parallel code builds
any rank's shard of any model on this machine."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore

import nxd


class MetaBackend:
    """The registered backend of a ``fake`` process group: tensors on the meta device."""

    name = "meta"
    process_group_backend = "fake"

    def is_available(self) -> bool:
        return True

    def device(self) -> torch.device:
        return torch.device("meta")

    def synchronize(self) -> None:
        pass

    def manual_seed(self, seed: int) -> None:
        pass


@contextlib.contextmanager
def fake_rank(rank: int, world_size: int) -> Iterator[None]:
    """This process plays ``rank`` of ``world_size`` until the block ends (then the world is gone)."""
    if dist.is_initialized():
        raise RuntimeError("nxd plan: a process group is already running in this process; the dry run needs its own")
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        with torch.device("meta"):
            yield
    finally:
        from nxd_core_parallel import parallel_state

        with contextlib.suppress(Exception):
            parallel_state.destroy_model_parallel()
        dist.destroy_process_group()


def build_rank_model(config: Any, run: Any) -> tuple[torch.nn.Module, nxd.ParallelContext, dict]:
    """Inside :func:`fake_rank`: this rank's model exactly as ``nxd train`` builds it (the same
    nxd config, model config and ``initialize_parallel_model`` hooks: TP/SP layers, activation
    checkpointing, the pipeline cut, the wrapper), with every tensor on the meta device."""
    from nxd_training import build
    from nxd_training.runtime import ensure_parallel_context

    context = ensure_parallel_context(config, run)  # as nxd train: the groups first, then the NxD config
    nxd_cfg = build.nxd_config(config, run)
    model_config = build.model_config_for_rank(config, run)
    build_fn = nxd.parallel.bind_context(run.spec.build, context)
    model = nxd.initialize_parallel_model(nxd_cfg, build_fn, False, model_config, nxd_cfg)
    return model, context, nxd_cfg
